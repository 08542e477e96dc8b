"""The offline API, with vLLM's names: `LLM(model).generate(prompts, sampling_params)` and `.chat(...)`; for
pooling models (embeddings) `.embed(texts)`, `.encode(...)`, `.score(texts_1, texts_2)` and `.rerank(...)`.

It drives the same multi-process engine the server uses (EngineClient's blocking face), so every test of
`LLM` exercises the real topology; `in_process=True` runs the scheduler and executor in the caller.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from engine.client.engine_client import EngineClient
from engine.client.pooling import pooling_inputs, pooling_output, tokenize_inputs
from engine.client.scoring import RankedDocument, cosine, rank_documents, score_pairs
from engine.client.tokenizer import load_tokenizer
from engine.config import EngineConfig
from engine.outputs import (
    CompletionOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestDelta,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
    TokenLogprobs,
)
from engine.sampling_params import PoolingParams, SamplingParams
from engine.structured_spec import validate as validate_structured_outputs


class LLM:
    def __init__(self, model: str | None = None, *, tokenizer: str | None = None, dtype: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, block_size: int = 16,
                 kv_cache_memory: int | None = None, enable_prefix_caching: bool = True,
                 tensor_parallel_size: int = 1, load_format: str = "auto", seed: int = 0,
                 device: str = "auto", enforce_eager: bool = False, **kwargs) -> None:
        fields = set(EngineConfig.__struct_fields__)
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise TypeError(f"LLM() got unknown options: {', '.join(unknown)}")
        self.config = EngineConfig(
            model=model or "", tokenizer=tokenizer, dtype=dtype, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size, kv_cache_memory=kv_cache_memory,
            enable_prefix_caching=enable_prefix_caching, tensor_parallel_size=tensor_parallel_size,
            load_format=load_format, seed=seed, device=device, enforce_eager=enforce_eager, **kwargs,
        )
        self._start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """An LLM over an EngineConfig built elsewhere (the CLI builds one from flags)."""
        llm = cls.__new__(cls)
        llm.config = config
        llm._start()
        return llm

    def _start(self) -> None:
        self.config.finalize()
        self.tokenizer = None if self.config.skip_tokenizer_init else load_tokenizer(self.config)
        self.engine = EngineClient(self.config).start()
        self._ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle
    def get_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this LLM was created with skip_tokenizer_init=True: it has no tokenizer")
        return self.tokenizer

    def shutdown(self) -> None:
        self.engine.shutdown_sync()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def start_profile(self, directory: str) -> str:
        """Start the executors' torch profilers; traces go to `directory` at stop_profile()."""
        return self.engine.call_sync("start_profile", dir=directory)

    def stop_profile(self) -> str:
        return self.engine.call_sync("stop_profile")

    def sleep(self, level: int = 1) -> str:
        """vLLM's sleep mode: free the KV cache (level 1) or the weights too (level 2); the next request or
        wake_up() restores them."""
        return self.engine.call_sync("sleep", level=level)

    def wake_up(self) -> str:
        return self.engine.call_sync("wake_up")

    def get_default_sampling_params(self) -> SamplingParams:
        """The params of a generate() or chat() call that passes none: the engine's sampling defaults
        (--generation-config, --override-generation-config), max_tokens 16 unless they set one (vLLM's)."""
        defaults = self.engine.generation_defaults
        return SamplingParams(max_tokens=defaults.get("max_tokens", 16)).resolved(defaults)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        items = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(items), self.get_default_sampling_params())
        requests = []
        for item, p in zip(items, params):
            if isinstance(item, str):
                requests.append(_Pending(item, self.get_tokenizer().encode(item), p))
            else:
                requests.append(_Pending(None, list(item["prompt_token_ids"]), p))
        return self._run(requests, use_tqdm)

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Chat conversations through the tokenizer's chat template (or `chat_template`), with `tools`
        (OpenAI's {"type": "function", "function": {...}} dicts) rendered into the prompt as the template
        does. The outputs are the raw generated text: tool calls are parsed by the server, not here."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        params = _as_params_list(sampling_params, len(conversations), self.get_default_sampling_params())
        requests = []
        for conversation, p in zip(conversations, params):
            text = self.get_tokenizer().apply_chat_template(
                conversation, tokenize=False, chat_template=chat_template, tools=tools,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, **(chat_template_kwargs or {}),
            )
            requests.append(_Pending(text, self.tokenizer.encode(text, add_special_tokens=False), p))
        return self._run(requests, use_tqdm)

    # ------------------------------------------------------------------ pooling models
    def encode(self, prompts, pooling_params: PoolingParams | None = None, *,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """A pooling model's vector for each input: strings, token ids, lists of either, or
        {"prompt_token_ids": [...]} dicts. An input over max_model_len is a ValueError unless
        truncate_prompt_tokens (here or in pooling_params; -1: max_model_len) cuts it."""
        self.engine.check_task(pooling=True)
        params = pooling_params or PoolingParams()
        truncate = params.truncate_prompt_tokens if truncate_prompt_tokens is None else truncate_prompt_tokens
        prompts = tokenize_inputs(self.tokenizer, pooling_inputs(prompts), self.config.max_model_len, truncate)
        return self._run_pooling(prompts, params, use_tqdm)

    def embed(self, prompts, pooling_params: PoolingParams | None = None, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """Embeddings (lists of floats) of the inputs, in order; see encode() for the inputs."""
        outputs = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm)
        return [EmbeddingRequestOutput.from_base(output) for output in outputs]

    def score(self, data_1, data_2, *, truncate_prompt_tokens: int | None = None,
              pooling_params: PoolingParams | None = None, use_tqdm: bool = True) -> list[ScoringRequestOutput]:
        """Cosine similarity of the embeddings of data_1's and data_2's texts, paired 1:1, 1:N or N:N."""
        inputs_1, inputs_2 = pooling_inputs(data_1), pooling_inputs(data_2)
        pairs = score_pairs(len(inputs_1), len(inputs_2))
        outputs = self.encode([*inputs_1, *inputs_2], pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm)
        first, second = outputs[: len(inputs_1)], outputs[len(inputs_1):]
        return [ScoringRequestOutput(str(k), ScoringOutput(cosine(first[i].outputs.data, second[j].outputs.data)),
                                     first[i].prompt_token_ids + second[j].prompt_token_ids)
                for k, (i, j) in enumerate(pairs)]

    def rerank(self, query, documents, *, top_n: int | None = None, truncate_prompt_tokens: int | None = None,
               pooling_params: PoolingParams | None = None, use_tqdm: bool = True) -> list[RankedDocument]:
        """The documents by their score against the query, best first (the first top_n of them)."""
        rank_documents([], top_n)
        scores = self.score(query, documents, truncate_prompt_tokens=truncate_prompt_tokens,
                            pooling_params=pooling_params, use_tqdm=use_tqdm)
        return rank_documents([s.outputs.score for s in scores], top_n)

    def _run_pooling(self, prompts: list[list[int]], params: PoolingParams,
                     use_tqdm: bool) -> list[PoolingRequestOutput]:
        engine = self.engine
        position: dict[str, int] = {}
        try:
            for i, prompt in enumerate(prompts):
                request_id = str(next(self._ids))
                engine.add_pooling_request(request_id, prompt, params)
                position[request_id] = i
        except BaseException:
            for request_id in position:
                engine.abort_request(request_id)
            raise
        results: list[PoolingRequestOutput | None] = [None] * len(prompts)
        unfinished = set(position)
        bar = _progress(len(prompts), use_tqdm)
        try:
            while unfinished:
                for delta in engine.poll(timeout=1.0):
                    if delta.finished and delta.request_id in unfinished:
                        unfinished.discard(delta.request_id)
                        i = position[delta.request_id]
                        results[i] = pooling_output(delta.request_id, prompts[i], delta)
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for request_id in unfinished:
                engine.abort_request(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return results

    def _run(self, requests: list[_Pending], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.engine
        streams: dict[str, _Stream] = {}
        try:
            for index, request in enumerate(requests):
                if request.params.stop and self.tokenizer is None:
                    raise ValueError("stop strings need a tokenizer (this LLM has skip_tokenizer_init=True)")
                if request.params.structured_outputs is not None:
                    validate_structured_outputs(request.params.structured_outputs)
                request.request_id = str(next(self._ids))
                for child in range(request.params.n):
                    stream = _Stream(index, request, child, self.tokenizer)
                    child_id = f"{request.request_id}-{child}"
                    engine.add_request(child_id, request.prompt_token_ids, request.params.child(child))
                    streams[child_id] = stream
        except BaseException:
            for child_id in streams:
                engine.abort_request(child_id)
            raise
        bar = _progress(len(streams), use_tqdm)
        unfinished = len(streams)
        generated = 0
        start = time.perf_counter()
        try:
            while unfinished:
                for delta in engine.poll(timeout=1.0):
                    stream = streams[delta.request_id]
                    if stream.finished:
                        continue    # a later step's news, read in the same poll, of a stop-string finish
                    generated += len(delta.new_token_ids)
                    if stream.apply(delta):
                        engine.abort_request(delta.request_id)
                    if stream.finished:
                        unfinished -= 1
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix_str(f"{generated / (time.perf_counter() - start):.1f} output tok/s")
        except BaseException:
            for child_id, stream in streams.items():
                if not stream.finished:
                    engine.abort_request(child_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [request.result(streams) for request in requests]


@dataclass
class _Pending:
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""

    def result(self, streams: dict[str, _Stream]) -> RequestOutput:
        children = [streams[f"{self.request_id}-{i}"] for i in range(self.params.n)]
        first = children[0]
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
            outputs=[c.completion() for c in children],
            prompt_logprobs=first.prompt_logprobs_dicts(),
            num_cached_tokens=first.num_cached_tokens, finished=True,
        )


@dataclass
class _Stream:
    """One child sequence being generated: its tokens, logprobs and stop-string detection."""

    index: int
    request: _Pending
    child: int
    tokenizer: object
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    detokenizer: object = None

    def __post_init__(self) -> None:
        if self.request.params.stop:        # stop strings must be found while generating
            self.detokenizer = self._new_detokenizer()

    def _new_detokenizer(self):
        from engine.client.detokenizer import Detokenizer

        return Detokenizer(self.tokenizer, self.request.params, self.request.prompt_token_ids)

    def apply(self, delta: RequestDelta) -> bool:
        """Take one delta of an unfinished sequence; True when a stop string ended it (the engine must
        abort it)."""
        if delta.num_cached_tokens is not None:
            self.num_cached_tokens = delta.num_cached_tokens
        if delta.prompt_logprobs:
            self.prompt_logprobs.extend(delta.prompt_logprobs)
        new = delta.new_token_ids
        if delta.finished:
            # finish_reason "error" (structured outputs: the grammar failed) puts the message in stop_reason
            self.finished, self.finish_reason = True, delta.finish_reason
            self.stop_reason = delta.error if delta.finish_reason == "error" else delta.stop_reason
        stopped = False
        if self.detokenizer is not None:
            self.detokenizer.update(new, finished=delta.finished, stop_terminated=self._stop_terminated())
            if self.detokenizer.stop_string is not None:
                # a stop string inside a run of tokens: the tokens after the one completing it are dropped
                new = new[:self.detokenizer.num_tokens - len(self.token_ids)]
                if not delta.finished:
                    self.finished, self.finish_reason = True, "stop"
                    self.stop_reason = self.detokenizer.stop_string
                    stopped = True
        self.token_ids.extend(new)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs[:len(new)])
        return stopped

    def _stop_terminated(self) -> bool:
        """Ended by EOS or a stop token id: that last token is not rendered as text."""
        return self.finish_reason == "stop" and not isinstance(self.stop_reason, str)

    def completion(self) -> CompletionOutput:
        params = self.request.params
        detokenizer = self.detokenizer
        if detokenizer is None and self.tokenizer is not None:   # no stop strings: one decode at the end
            detokenizer = self._new_detokenizer()
            detokenizer.update(self.token_ids, finished=True, stop_terminated=self._stop_terminated())
        logprobs = cumulative = None
        if params.logprobs is not None:
            logprobs = [dict(zip(lp.token_ids, lp.logprobs)) for lp in self.logprobs]
            cumulative = float(sum(lp.logprobs[0] for lp in self.logprobs))
        return CompletionOutput(index=self.child, text=detokenizer.text if detokenizer else "", token_ids=list(self.token_ids),
                                finish_reason=self.finish_reason, stop_reason=self.stop_reason,
                                logprobs=logprobs, cumulative_logprob=cumulative)

    def prompt_logprobs_dicts(self) -> list[dict[int, float] | None] | None:
        if self.request.params.prompt_logprobs is None:
            return None
        return [None if lp is None else dict(zip(lp.token_ids, lp.logprobs)) for lp in self.prompt_logprobs]


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    items = list(prompts)
    for i, item in enumerate(items):
        if isinstance(item, dict):
            if "prompt_token_ids" not in item:
                raise ValueError(f"prompt {i}: a dict prompt needs 'prompt_token_ids'")
        elif not isinstance(item, str):
            raise TypeError(f"prompt {i}: expected a string or a {{'prompt_token_ids': [...]}} dict, "
                            f"got {type(item).__name__}")
    return items


def _as_params_list(params, count: int, default: SamplingParams) -> list[SamplingParams]:
    if params is None:
        return [default] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts")
    return params


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)

