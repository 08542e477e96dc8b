"""POST /v1/completions: prompts as text, text lists, token ids or token-id lists; n, echo, logprobs."""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request

from frontend.chat.structured_outputs import structured_outputs
from frontend.choices import Choice
from frontend.errors import invalid
from frontend.http_responses import DisconnectAwareResponse
from frontend.openai.logprobs import completion_logprobs, prompt_logprobs_json
from frontend.openai.protocol import DEFAULT_COMPLETION_MAX_TOKENS, MAX_PROMPTS, CompletionRequest
from frontend.openai.wire import OpenAIWire
from frontend.runner import Run, Step
from frontend.serving_engine import OpenAIServing, ServingContext

_PROMPT_KINDS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, CompletionRequest)
        self.check_engine()
        texts, prompts = self._split_prompts(req.prompt)
        if texts:
            prompts = await self.tokenize_prompts(texts, add_special_tokens=True)
        for ids in prompts:
            self.check_token_ids(ids, "prompt")

        prompt_logprobs = req.prompt_logprobs
        if req.echo and req.logprobs is not None:   # echoed prompt tokens carry logprobs too
            prompt_logprobs = max(prompt_logprobs or 0, req.logprobs)
        structured, structured_param = await structured_outputs(req)
        params = self.sampling_params(req, logprobs=req.logprobs, prompt_logprobs=prompt_logprobs, names={},
                                      structured_outputs=structured)
        per_prompt = [self.prompt_params(params, len(ids), self._max_tokens(req, len(ids)), "max_tokens", "prompt")
                      for ids in prompts]
        echo_texts = None
        if req.echo:
            echo_texts = texts or [self.decode(ids) for ids in prompts]
        response_id = self.new_id("cmpl")
        run = self.run(request, response_id, prompts, per_prompt, req.n, arrival, keep_output=not req.stream,
                       echo_texts=echo_texts, priority=req.priority, cache_salt=req.cache_salt,
                       structured=structured_param)
        return run.respond(CompletionWire(run, self.ctx, req), req.stream)

    def _max_tokens(self, req: CompletionRequest, prompt_len: int) -> int | None:
        if req.max_tokens is not msgspec.UNSET:
            return req.max_tokens
        # the default never makes a request fail: it is capped by what the context has left (and, as in vLLM,
        # by the default sampling's max_tokens when a generation config sets one)
        default = min(DEFAULT_COMPLETION_MAX_TOKENS, self.ctx.generation_defaults.get("max_tokens", 1 << 30))
        return max(1, min(default, self.ctx.max_model_len - prompt_len))

    @staticmethod
    def _split_prompts(prompt) -> tuple[list[str], list[list[int]]]:
        """(text prompts, token prompts): exactly one of them is non-empty."""
        if isinstance(prompt, str):
            return [prompt], []
        if not prompt:
            raise invalid(f"prompt must not be empty; it is {_PROMPT_KINDS}", "prompt")
        if all(isinstance(p, int) for p in prompt):
            return [], [prompt]
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", "prompt")
        if all(isinstance(p, str) for p in prompt):
            return prompt, []
        if all(isinstance(p, list) for p in prompt):
            return [], prompt
        raise invalid(f"prompt mixes kinds; it must be {_PROMPT_KINDS}", "prompt")


class CompletionWire(OpenAIWire):
    object_name = "text_completion"

    def __init__(self, run: Run, ctx: ServingContext, req: CompletionRequest):
        super().__init__(run, ctx.model_name, include_usage=req.include_usage, logprobs=req.logprobs)
        self.token_strings = ctx.token_strings
        self.echo = req.echo
        self.prompt_logprobs = req.prompt_logprobs is not None

    def text_item(self, choice: Choice, text: str) -> dict:
        return {"index": choice.index, "text": text, "logprobs": None, "finish_reason": None, "stop_reason": None}

    def step_chunk(self, step: Step) -> dict:
        choice, delta = step.choice, step.delta
        logprobs = None
        if self.logprobs is not None:
            ids, rows = [], []
            if self.echo and delta.prompt_logprobs:
                start = choice.prompt_position
                choice.prompt_position += len(delta.prompt_logprobs)
                ids += choice.prompt_token_ids[start:choice.prompt_position]
                rows += delta.prompt_logprobs
            ids += delta.new_token_ids
            rows += delta.logprobs or ()
            logprobs, choice.text_offset = completion_logprobs(ids, rows, self.token_strings, choice.text_offset)
        return self.chunk_for({"index": choice.index, "text": step.text, "logprobs": logprobs,
                               "finish_reason": choice.finish_reason if step.finished else None,
                               "stop_reason": choice.stop_reason if step.finished else None})

    def body(self) -> dict:
        strs = self.token_strings
        choices = []
        for choice in self.run.choices:
            logprobs = None
            if self.logprobs is not None:
                ids, rows = [], []
                if self.echo:
                    prompt = choice.prompt_token_ids
                    ids += prompt
                    rows += choice.prompt_logprobs[:len(prompt)]
                    rows += [None] * (len(prompt) - len(rows))
                ids += choice.token_ids
                rows += choice.logprobs
                logprobs, _ = completion_logprobs(ids, rows, strs)
            item = {"index": choice.index, "text": choice.text, "logprobs": logprobs,
                    "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
            if self.prompt_logprobs:
                item["prompt_logprobs"] = prompt_logprobs_json(choice.prompt_logprobs, strs)
            choices.append(item)
        return self.body_for(self.object_name, choices)
