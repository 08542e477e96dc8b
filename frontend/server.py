"""launch_server: start the engine, serve the app with hypercorn, drain on SIGTERM, stop the engine.

The listening socket is bound first (a taken port fails in a second, not after a minute of weight
loading), then the engine starts in a thread while the event loop stays responsive to signals, then
hypercorn serves. SIGTERM or SIGINT stops accepting, gives in-flight requests `shutdown_timeout` seconds,
cancels the rest (which aborts them in the engine), stops the engine and returns normally (exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from frontend.app import create_app
from frontend.config import ServerConfig

logger = logging.getLogger("ringserve.server")


def launch_server(config: ServerConfig, engine_client=None) -> None:
    """Serve until SIGTERM/SIGINT. engine_client: an EngineClient (or look-alike) not yet started;
    default: EngineClient(config.engine). Raises what the engine's startup raised."""
    config.validate()
    configure_logging(config.log_level)
    asyncio.run(_serve(config, engine_client))


def describe_bytes(sizes: dict[str, int]) -> str:
    """The startup line's weights: 'Q4_1 66.4 MB, Q8_0 30.1 MB, float16 0.1 MB (96.5 MB)'."""
    parts = [f"{kind} {count / 1e6:.1f} MB" for kind, count in sorted(sizes.items(), key=lambda kv: -kv[1])]
    return f"{', '.join(parts)} ({sum(sizes.values()) / 1e6:.1f} MB)" if parts else "none reported"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("ringserve").setLevel(level.upper())


async def _serve(config: ServerConfig, engine_client) -> None:
    sock = bind_socket(config.host, config.port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if engine_client is None:
            from engine.client.dp_client import make_engine_client

            engine_client = make_engine_client(config.engine)
        try:
            if not await _start_engine(engine_client, stop):
                logger.info("stopped while the engine was starting")
                return
            app = create_app(engine_client, config)
            host, port = sock.getsockname()[:2]
            logger.info("serving %s on http://%s:%d (weights: %s)", engine_client.config.model_name, host, port,
                        describe_bytes(getattr(engine_client, "weight_bytes", {})))
            await serve(app, hypercorn_config(config, sock.detach()), shutdown_trigger=stop.wait)
            logger.info("stopped serving; shutting the engine down")
        finally:
            await engine_client.shutdown()
    finally:
        sock.close()     # a no-op once hypercorn owns the descriptor
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _start_engine(engine_client, stop: asyncio.Event) -> bool:
    """EngineClient.start() blocks until the handshake; run it in a daemon thread so a signal can still stop
    the server (and so a hung start cannot keep the process alive). False when stopped first."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not started.done():
            started.set_result(True) if error is None else started.set_exception(error)

    def hand_over(error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:        # the server stopped and its loop closed before the start finished
            pass

    def run() -> None:
        try:
            engine_client.start()
        except BaseException as e:  # handed to the event loop, which re-raises it
            hand_over(e)
        else:
            hand_over(None)

    threading.Thread(target=run, name="engine-start", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({started, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if started.done():
        started.result()
        return True
    return False


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow happens; port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def hypercorn_config(config: ServerConfig, fd: int) -> HypercornConfig:
    """Hypercorn's settings for serving on the listening socket `fd` (which hypercorn then owns)."""
    settings = HypercornConfig()
    settings.bind = [f"fd://{fd}"]
    settings.graceful_timeout = config.shutdown_timeout
    # Our loggers, so hypercorn's lines go through the one root handler (no second stderr handler).
    settings.errorlog = logging.getLogger("hypercorn.error")
    settings.accesslog = logging.getLogger("hypercorn.access") if config.enable_access_log else None
    settings.loglevel = config.log_level.upper()
    settings.h11_max_incomplete_size = config.max_header_bytes
    return settings
