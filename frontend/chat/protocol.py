"""The chat request (OpenAI's shape, plus vLLM's extensions) as msgspec Structs: decoding a body validates it.
The other APIs translate their requests into it; `SamplingRequest` and the bounded field types are shared
with the completions request (frontend/openai/protocol.py) and the other APIs' own types.

Ranges follow OpenAI's documentation (temperature 0..2, penalties -2..2, top_logprobs 0..20, n 1..128,
logit_bias -100..100); sizes are bounded so that no single field can make the server do unbounded work.
Fields that OpenAI clients send but ringserve does not act on (user, ...) are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from engine.sampling_params import MAX_N, MAX_STOP_STRINGS

MAX_CHOICES = 512              # prompts x n
MAX_MESSAGES = 4096
MAX_STOP_STRING_CHARS = 1024
MAX_TOKEN_ID_LIST = 4096       # stop_token_ids, allowed_token_ids, logit_bias entries
MAX_ID_CHARS = 256             # cache_salt, user, model, role, name

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
ShortStr = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
StopString = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
TokenIdList = Annotated[list[NonNegativeInt], Meta(max_length=MAX_TOKEN_ID_LIST)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class StructuredOutputsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs` object (checked further by engine.sampling_params.StructuredOutputsParams)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None     # refused: xgrammar has no equivalent
    backend: str | None = None                # xgrammar or auto


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: ShortStr | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's response_format: text, json_object, json_schema; vLLM's structural_tag (both forms)."""

    type: Annotated[str, Meta(max_length=MAX_ID_CHARS)]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None                  # structural_tag
    structures: list[dict[str, Any]] | None = None        # structural_tag, legacy form
    triggers: list[str] | None = None


class SamplingRequest(msgspec.Struct, kw_only=True):
    """The fields that completions and chat share: the model, sampling and stopping."""

    model: ShortStr | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    seed: int | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: Annotated[dict[str, Bias], Meta(max_length=MAX_TOKEN_ID_LIST)] | None = None
    user: ShortStr | None = None
    # vLLM's extensions
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Probability | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    min_tokens: NonNegativeInt = 0
    stop_token_ids: TokenIdList | None = None
    allowed_token_ids: TokenIdList | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: NonNegativeInt | None = None
    cache_salt: ShortStr | None = None
    priority: int = 0
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs, and the old guided_* aliases
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: ShortStr | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    # a string, or content parts ({"type": "text", "text": ...}; other types are refused when served)
    content: str | list[dict[str, Any]] | None = None
    name: ShortStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: ShortStr | None = None
    reasoning: str | None = None              # vLLM's name for the reasoning of an earlier turn
    reasoning_content: str | None = None      # DeepSeek's name for it


Messages = Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]


class ChatCompletionRequest(SamplingRequest, kw_only=True):
    messages: Messages
    # checked by frontend.chat.tool_choice (at most 128 tools; the decoder's bound only stops huge lists early)
    tools: Annotated[list[dict[str, Any]], Meta(max_length=1024)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    include_reasoning: bool = True            # vLLM's: false leaves the reasoning out of the response
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    add_special_tokens: bool = False
    echo: bool = False                # vLLM's: the reply starts with the final message's text when that
                                      # message is the assistant's (continue_final_message's usual pair)
