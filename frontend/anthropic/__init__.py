"""Anthropic's Messages API as a layer over chat: the request types (`protocol.py`), their translation into
a chat request (`translate.py`), and /v1/messages and /v1/messages/count_tokens (`messages.py`)."""
