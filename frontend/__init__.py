"""The frontend process: the HTTP server (starlette app, hypercorn), the OpenAI protocol and its handlers,
metrics, and the `ringserve` command line (`frontend.cli`). It holds an `engine.client.EngineClient` and
reaches the engine through it alone.
"""

from __future__ import annotations


def version() -> str:
    """ringserve's installed version ('0+unknown' when run from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("ringserve")
    except PackageNotFoundError:
        return "0+unknown"
