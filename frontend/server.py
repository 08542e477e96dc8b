"""launch_server: start the engine, serve the app with hypercorn, drain on SIGTERM, stop the engine.

The listening socket is bound first (a taken port fails in a second, not after a minute of weight
loading), then the engine starts in a thread while the event loop stays responsive to signals, then
hypercorn serves. SIGTERM or SIGINT stops accepting and gives in-flight requests `shutdown_timeout`
seconds; then every unfinished engine request fails with an error its handler reports as it would an
engine's death (a stream ends with an error event, and [DONE] for OpenAI streams; a waiting request gets
a 503), so that no client sees a connection cut mid-body; hypercorn waits SHUTDOWN_GRACE_S more for those
answers to go out. Then the engine stops and the server returns normally (exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from engine.errors import EngineDeadError
from frontend.app import create_app
from frontend.config import ServerConfig
from frontend.startup import configure_logging, note, ready_line

logger = logging.getLogger("ringserve.server")
SHUTDOWN_GRACE_S = 3.0      # after --shutdown-timeout: time for the unfinished requests' error answers


def launch_server(config: ServerConfig, engine_client=None) -> None:
    """Serve until SIGTERM/SIGINT. engine_client: an EngineClient (or look-alike) not yet started;
    default: EngineClient(config.engine). Raises what the engine's startup raised."""
    config.validate()
    configure_logging(config.log_level)
    asyncio.run(_serve(config, engine_client))


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
            engine = engine_client.config
            note("starting the engine: a scheduler and %d executor process(es) on %s",
                 engine.tensor_parallel_size * engine.data_parallel_size, engine.resolved_device)
            if not await _start_engine(engine_client, stop):
                logger.info("stopped while the engine was starting")
                return
            note("loading the tokenizer and chat template")
            app = create_app(engine_client, config)
            host, port = sock.getsockname()[:2]
            url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            logger.info("%s", ready_line(engine_client, url, getattr(app.state, "web_page_path", None)))
            expire = asyncio.ensure_future(_fail_unfinished_after(stop, engine_client, config.shutdown_timeout))
            try:
                await serve(app, hypercorn_config(config, sock.detach()), shutdown_trigger=stop.wait)
            finally:
                expire.cancel()
            logger.info("stopped serving; shutting the engine down")
        finally:
            await engine_client.shutdown()
    finally:
        sock.close()     # a no-op once hypercorn owns the descriptor
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _fail_unfinished_after(stop: asyncio.Event, engine_client, timeout: float) -> None:
    await stop.wait()
    await asyncio.sleep(timeout)
    if engine_client.num_unfinished:
        logger.info("%d requests did not finish within --shutdown-timeout (%g s); ending them",
                    engine_client.num_unfinished, timeout)
    engine_client.fail_unfinished(EngineDeadError(
        f"the server shut down before this request finished (--shutdown-timeout {timeout:g} s)"))


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
    settings.graceful_timeout = config.shutdown_timeout + SHUTDOWN_GRACE_S
    # Our loggers, so hypercorn's lines go through the one root handler (no second stderr handler).
    settings.errorlog = logging.getLogger("hypercorn.error")
    settings.accesslog = logging.getLogger("hypercorn.access") if config.enable_access_log else None
    settings.loglevel = config.log_level.upper()
    settings.h11_max_incomplete_size = config.max_header_bytes
    return settings
