"""The OpenAI API's own request types besides chat (frontend/chat/protocol.py): completions, embeddings, and
vLLM's /tokenize, /detokenize, /score and /rerank (the last in Jina's and Cohere's shape)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from frontend.chat.protocol import (
    Messages,
    NonNegativeInt,
    PositiveInt,
    SamplingRequest,
    ShortStr,
    TokenIdList,
)

MAX_PROMPTS = 256              # prompts in one completions request
MAX_POOLING_INPUTS = 2048      # inputs of one embeddings request, texts on one side of a score, documents (OpenAI's)
DEFAULT_COMPLETION_MAX_TOKENS = 16     # OpenAI's and vLLM's default when a completions request omits max_tokens


class CompletionRequest(SamplingRequest, kw_only=True):
    # Omitted: 16 (OpenAI's default, capped by the context); an explicit null: what the context allows (vLLM's).
    max_tokens: PositiveInt | None | msgspec.UnsetType = msgspec.UNSET
    # str | list[str] | list[int] | list[list[int]]; msgspec allows one array type per union, so the list's
    # elements are checked to be all of one kind when the request is served.
    prompt: str | Annotated[list[str | int | TokenIdList], Meta(max_length=1 << 20)]
    echo: bool = False
    logprobs: NonNegativeInt | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """vLLM's /tokenize: either a prompt or chat messages (with the chat template fields of chat requests)."""

    model: ShortStr | None = None
    prompt: str | None = None
    messages: Messages | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None   # default: True for a prompt, False for messages
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: ShortStr | None = None
    tokens: Annotated[list[NonNegativeInt], Meta(max_length=1 << 20)]


# vLLM's truncate_prompt_tokens: -1 cuts inputs to max_model_len, k to k tokens (0 and below -1 are refused by
# PoolingParams, with a message naming the field)
TruncatePromptTokens = Annotated[int, Meta(ge=-1)]
TokenIds = Annotated[list[NonNegativeInt], Meta(max_length=1 << 20)]
PoolingText = Annotated[list[str], Meta(max_length=MAX_POOLING_INPUTS)]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """OpenAI's embeddings request, with vLLM's extensions (truncate_prompt_tokens, normalize, priority,
    add_special_tokens). `input`: a string, a list of strings, token ids, or a list of token-id lists (one
    array type per msgspec union: the kinds are checked when the request is served)."""

    model: ShortStr | None = None
    input: str | Annotated[list[str | int | TokenIds], Meta(max_length=1 << 20)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: ShortStr | None = None            # accepted, as OpenAI clients send it; unused
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    normalize: bool | None = None           # default: the model's own (its Normalize module)
    add_special_tokens: bool = True
    priority: int = 0


class ScoreRequest(msgspec.Struct, kw_only=True):
    """vLLM's /score: text_1 against text_2, each a string or a list (1:1, 1:N or N:N pairs)."""

    model: ShortStr | None = None
    text_1: str | PoolingText
    text_2: str | PoolingText
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    user: ShortStr | None = None
    priority: int = 0


class RerankDocument(msgspec.Struct, kw_only=True):
    """A document as Jina and Cohere also take it: an object with its text."""

    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    """/rerank and /v1/rerank (vLLM's, in Jina's and Cohere's shape): the documents by relevance to the query.
    top_n: how many results (absent, null or 0: all)."""

    model: ShortStr | None = None
    query: str
    documents: Annotated[list[str | RerankDocument], Meta(max_length=MAX_POOLING_INPUTS)]
    top_n: NonNegativeInt | None = None
    return_documents: bool = True
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    user: ShortStr | None = None
    priority: int = 0
