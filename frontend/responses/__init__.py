"""OpenAI's Responses API: /v1/responses (create, get, delete) and its store, as a layer over chat."""
