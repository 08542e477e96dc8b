"""OpenAI's API: /v1/chat/completions (`chat.py`), /v1/completions (`completions.py`), /v1/models
(`models.py`), and vLLM's /tokenize and /detokenize (`tokenize.py`); `wire.py` is what chat and completions
share on the wire, `logprobs.py` their logprobs shapes, `protocol.py` the request types besides chat's."""
