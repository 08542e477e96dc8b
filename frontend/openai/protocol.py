"""The OpenAI API's own request types besides chat (frontend/chat/protocol.py): completions, and vLLM's
/tokenize and /detokenize."""

from __future__ import annotations

from typing import Annotated, Any

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
