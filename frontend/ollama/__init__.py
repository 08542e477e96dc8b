"""Ollama's API (/api/...) as a layer over chat, for the tools that speak it (Open WebUI, Continue, VS Code,
the `ollama` clients and CLI): requests translated into chat requests (translate.py, options.py), prepared
by the one chat preparation and run by the one runner, written as NDJSON or one object (wire.py); the
model's card for tags/show/ps (models.py); keep_alive and its lifecycle hook (keep_alive.py)."""
