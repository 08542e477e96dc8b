"""Incremental detokenization and stop strings, per request (shared by the server and the offline `LLM`).

`IncrementalDetokenizer` turns token ids into text deltas with the prefix/read-offset scheme: it decodes a
short window of recent ids twice (with and without the new ones) through the Rust tokenizer and emits the
difference, holding text back while it ends in an incomplete UTF-8 sequence ("\ufffd"). The cost per token
is O(window), not O(output length). The window starts a few tokens into the prompt so that tokenizers whose
decoder strips a leading space (SentencePiece's Metaspace) render the first output token as it would appear
after the prompt.

`StopStringChecker` finds stop strings that span token boundaries and holds back the last
(longest stop string - 1) characters until they cannot start a match, as vLLM does, so that a stop string
never reaches the client, not even in part, unless include_stop_str_in_output is set.

`Detokenizer` combines the two with vLLM's rules: no stop-string check until min_tokens were produced; the
token that ended a request by EOS or stop_token_ids is not rendered unless include_stop_str_in_output.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.sampling_params import SamplingParams

REPLACEMENT_CHAR = "\ufffd"
# How many prompt tokens the decode window starts with (as vLLM's incremental detokenizer does).
PROMPT_CONTEXT_TOKENS = 5


def backend_tokenizer(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a Hugging Face fast tokenizer (or the tokenizer itself)."""
    return getattr(tokenizer, "backend_tokenizer", tokenizer)


class IncrementalDetokenizer:
    """Token ids in, text deltas out; the concatenated deltas equal the decode of all ids (after flush)."""

    __slots__ = ("_decode", "_skip_special", "_ids", "_prefix_offset", "_read_offset", "_prefix_text")

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int] = (), *, skip_special_tokens: bool = True):
        self._decode = backend_tokenizer(tokenizer).decode
        self._skip_special = skip_special_tokens
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        prefix_text = self._decode(context, skip_special_tokens=skip_special_tokens) if context else ""
        if REPLACEMENT_CHAR in prefix_text:
            # The prompt ends inside a multi-byte character: its text would not be a prefix of the next decode.
            context, prefix_text = [], ""
        self._ids = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = prefix_text

    def push(self, token_ids: Sequence[int]) -> str:
        """Append token ids; return the text they complete ("" while a character is still incomplete)."""
        if not token_ids:
            return ""
        ids = self._ids
        ids.extend(token_ids)
        text = self._decode(ids[self._prefix_offset:], skip_special_tokens=self._skip_special)
        if len(text) <= len(self._prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = text[len(self._prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        self._prefix_text = self._decode(ids[self._prefix_offset:], skip_special_tokens=self._skip_special)
        return delta

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end renders as "\ufffd")."""
        if self._read_offset == len(self._ids):
            return ""
        text = self._decode(self._ids[self._prefix_offset:], skip_special_tokens=self._skip_special)
        self._read_offset = len(self._ids)
        delta = text[len(self._prefix_text):]
        self._prefix_offset = self._read_offset
        self._prefix_text = ""
        return delta


class StopStringChecker:
    """Finds the first stop string in a stream of text deltas and decides how much text is safe to emit."""

    __slots__ = ("_stops", "_include", "_tail", "_pending", "_hold", "_keep")

    def __init__(self, stop: Sequence[str], *, include_stop_str_in_output: bool = False):
        self._stops = tuple(stop)
        self._include = include_stop_str_in_output
        longest = max(map(len, self._stops), default=0)
        self._keep = max(longest - 1, 0)          # text a match may reach back into
        self._hold = 0 if include_stop_str_in_output else self._keep   # text not yet safe to emit
        self._tail = ""                           # the last `_keep` characters seen
        self._pending = 0                         # how many characters at the end of `_tail` are not emitted

    def append(self, text: str, *, check: bool = True, final: bool = False) -> tuple[str, str | None]:
        """Add text; return (text safe to emit now, the stop string that matched or None).

        After a match nothing more should be appended. `check=False` adds text without looking for stop
        strings (min_tokens not reached yet); `final=True` releases everything held back.
        """
        window = self._tail + text
        emitted_upto = len(self._tail) - self._pending    # window[:emitted_upto] already went out
        if check and text:
            match_at, match = -1, None
            for stop in self._stops:
                # Only matches that end inside the new text: earlier ones were looked for already.
                at = window.find(stop, max(len(self._tail) - len(stop) + 1, 0))
                if at != -1 and (match is None or at < match_at):
                    match_at, match = at, stop
            if match is not None:
                end = match_at + len(match) if self._include else match_at
                return window[emitted_upto:max(end, emitted_upto)], match
        release = len(window) if final else max(len(window) - self._hold, emitted_upto)
        out = window[emitted_upto:release]
        if self._keep:
            self._tail = window[-self._keep:]
            self._pending = len(window) - release      # at most _hold <= _keep, so it lies within _tail
        else:
            self._tail, self._pending = "", 0
        return out, None


class Detokenizer:
    """One request's detokenization with vLLM's stop-string semantics; `text` is the output so far."""

    __slots__ = ("_incremental", "_stops", "_min_tokens", "_include_stop", "_num_tokens", "_pieces",
                 "stop_string", "finished")

    def __init__(self, tokenizer, params: SamplingParams, prompt_token_ids: Sequence[int] = ()):
        self._incremental = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens
        )
        self._stops = (
            StopStringChecker(params.stop, include_stop_str_in_output=params.include_stop_str_in_output)
            if params.stop else None
        )
        self._min_tokens = params.min_tokens
        self._include_stop = params.include_stop_str_in_output
        self._num_tokens = 0
        self._pieces: list[str] = []
        self.stop_string: str | None = None      # set when a stop string ended the output
        self.finished = False

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def num_tokens(self) -> int:
        """Output tokens taken so far: after a stop string, those up to the one that completed it."""
        return self._num_tokens

    def update(self, new_token_ids: Sequence[int], *, finished: bool = False,
               stop_terminated: bool = False) -> str:
        """Add one step's tokens; return the text that became final.

        finished: the engine ended the request with these tokens; stop_terminated: it ended by EOS or a stop
        token id, which is then not rendered (unless include_stop_str_in_output). When a stop string matches,
        `stop_string` is set, `finished` turns True and the caller must end the request; the tokens after
        the one that completed it are not taken (num_tokens says how many were).
        """
        if self.finished:
            return ""
        if self._stops is not None and len(new_token_ids) > 1:
            # several tokens in one step (speculative decoding, a slow reader): a stop string, and where
            # min_tokens lets the check begin, fall on the token they would fall on one token a step
            last = len(new_token_ids) - 1
            return "".join(self.update(new_token_ids[i:i + 1], finished=finished and i == last,
                                       stop_terminated=stop_terminated and i == last)
                           for i in range(len(new_token_ids)) if not self.finished)
        self._num_tokens += len(new_token_ids)
        if stop_terminated and not self._include_stop and new_token_ids:
            new_token_ids = new_token_ids[:-1]
        text = self._incremental.push(new_token_ids)
        if finished:
            text += self._incremental.flush()
            self.finished = True
        if self._stops is not None:
            text, self.stop_string = self._stops.append(
                text, check=self._num_tokens > self._min_tokens, final=finished
            )
            if self.stop_string is not None:
                self.finished = True
        if text:
            self._pieces.append(text)
        return text
