"""OpenAI's Responses API as a layer over chat: the request types (`protocol.py`), their translation into a
chat request (`translate.py`), /v1/responses create, get and delete (`handlers.py`), and the bounded,
expiring store of earlier responses (`store.py`)."""
