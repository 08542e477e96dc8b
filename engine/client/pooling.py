"""Pooling requests on the frontend's side: their inputs, their params, and their vectors.

- `pooling_inputs`: the input shapes OpenAI's embeddings API and vLLM's `LLM.embed` take (a string, a list of
  strings, a list of token ids, a list of such lists, `{"prompt_token_ids": [...]}` dicts) as one list.
- `tokenize_inputs`: texts through the tokenizer in one batch call (with its special tokens, as
  sentence-transformers does), `truncate_prompt_tokens` applied on the tokenizer's truncation side.
- `resolve_pooling_params`: a request's PoolingParams with the model's defaults filled in and `dimensions`
  checked, before it reaches the engine; `finish_vector` applies them to the engine's raw vector.
"""

from __future__ import annotations

import numpy as np

from engine.config import EngineConfig
from engine.outputs import PoolingOutput, PoolingRequestOutput, RequestDelta
from engine.sampling_params import PoolingParams

PoolingInput = str | list[int]
NORM_EPS = 1e-12            # torch.nn.functional.normalize's, which sentence-transformers' Normalize uses


def pooling_inputs(prompts) -> list[PoolingInput]:
    """A string, token ids or a {"prompt_token_ids": [...]} dict, or a list of them -> a list of inputs."""
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and _is_token_ids(prompts)):
        prompts = [prompts]
    items = []
    for i, item in enumerate(prompts):
        if isinstance(item, dict):
            if "prompt_token_ids" not in item:
                raise ValueError(f"input {i}: a dict input needs 'prompt_token_ids'")
            item = item["prompt_token_ids"]
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, (list, tuple)) and _is_token_ids(item):
            items.append(list(item))
        else:
            raise TypeError(f"input {i}: expected a string or a list of token ids, got {type(item).__name__}")
    if not items:
        raise ValueError("no input was given")
    return items


def _is_token_ids(items) -> bool:
    return len(items) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in items)


TRUNCATE_REMEDY = "pass truncate_prompt_tokens (-1: that maximum) to truncate it"


def too_long_message(num_tokens: int, max_model_len: int, remedy: str = TRUNCATE_REMEDY) -> str:
    """What refuses an input longer than the model takes (the offline API and the server say the same; an API
    whose truncation field is another names that one in `remedy`)."""
    return (f"the input has {num_tokens} tokens, more than this model's maximum input length, max_model_len "
            f"({max_model_len}); {remedy}")


def truncation_length(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """The length inputs are cut to (None: not cut; an input over max_model_len is then an error)."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return max_model_len
    if truncate_prompt_tokens > max_model_len:
        raise ValueError(f"truncate_prompt_tokens ({truncate_prompt_tokens}) is greater than this model's maximum "
                         f"input length, max_model_len ({max_model_len})")
    return truncate_prompt_tokens


def tokenize_inputs(tokenizer, inputs: list[PoolingInput], max_model_len: int,
                    truncate_prompt_tokens: int | None = None) -> list[list[int]]:
    """Token ids of each input: texts tokenized (special tokens added, one batch call), token ids kept; both cut
    to truncate_prompt_tokens (-1: max_model_len) on the tokenizer's truncation side when it is given."""
    length = truncation_length(truncate_prompt_tokens, max_model_len)
    texts = [i for i, item in enumerate(inputs) if isinstance(item, str)]
    result: list = list(inputs)
    if texts:
        if tokenizer is None:
            raise ValueError("text inputs need a tokenizer (this engine has skip_tokenizer_init=True)")
        encoded = tokenizer([inputs[i] for i in texts], add_special_tokens=True, truncation=length is not None,
                            max_length=length)["input_ids"]
        for i, ids in zip(texts, encoded):
            result[i] = ids
    left = getattr(tokenizer, "truncation_side", "right") == "left"
    for i, item in enumerate(inputs):
        if not isinstance(item, str) and length is not None and len(item) > length:
            result[i] = item[-length:] if left else item[:length]
    return result


def resolve_pooling_params(params: PoolingParams | None, config: EngineConfig) -> PoolingParams:
    """params with normalize set to the model's default when unset; ValueError for `dimensions` the model
    cannot give (only Matryoshka models can)."""
    params = params or PoolingParams()
    pooler = config.pooler_config
    dims = params.dimensions
    if dims is not None:
        allowed = pooler.matryoshka_dimensions
        if allowed == [] or dims > config.hidden_size:
            raise ValueError(f"dimensions: {config.model_name} gives {config.hidden_size}-dimensional embeddings and "
                             f"does not support matryoshka representation (other sizes); leave dimensions unset")
        if allowed is not None and dims not in allowed:
            raise ValueError(f"dimensions {dims} is not one of this model's matryoshka dimensions "
                             f"{', '.join(map(str, allowed))}")
    if params.normalize is None:
        return PoolingParams(truncate_prompt_tokens=params.truncate_prompt_tokens, dimensions=dims,
                             normalize=bool(pooler.normalize))
    return params


def finish_vector(vector: np.ndarray, params: PoolingParams | None) -> np.ndarray:
    """The engine's pooled vector as the request asked: the first `dimensions` components, L2-normalized
    when `normalize` (as torch.nn.functional.normalize: divided by max(norm, 1e-12)); float32, a copy."""
    if params is not None and params.dimensions is not None:
        vector = vector[: params.dimensions]
    vector = np.array(vector, dtype=np.float32)
    if params is not None and params.normalize:
        vector /= max(float(np.linalg.norm(vector)), NORM_EPS)
    return vector


def pooling_output(request_id: str, prompt_token_ids: list[int], delta: RequestDelta) -> PoolingRequestOutput:
    """The result of a finished pooling request; ValueError when it ended without a vector (refused or aborted)."""
    if delta.pooled is None:
        raise ValueError(f"pooling request {request_id} ended without a vector: "
                         f"{delta.error or delta.finish_reason or 'no result'}")
    return PoolingRequestOutput(request_id, PoolingOutput(delta.pooled), list(prompt_token_ids))
