"""launch_server: start the engine, serve the app with hypercorn, drain on SIGTERM, stop the engines.

The listening socket is bound first (a taken port fails in a second, not after a minute of weight
loading), then the served models are found (the MODEL argument, --models-dir), the MODEL's engine starts in
a thread while the event loop stays responsive to signals, then hypercorn serves (the other models start on
demand). SIGTERM or SIGINT stops accepting and gives in-flight requests `shutdown_timeout`
seconds; then every unfinished engine request fails with an error its handler reports as it would an
engine's death (a stream ends with an error event, and [DONE] for OpenAI streams; a waiting request gets
a 503), so that no client sees a connection cut mid-body; hypercorn waits SHUTDOWN_GRACE_S more for those
answers to go out. Then the engines stop and the server returns normally (exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from engine.client.dp_client import make_engine_client
from engine.client.model_pool import ModelPool
from engine.errors import EngineDeadError
from frontend.app import create_app
from frontend.config import ServerConfig
from frontend.models.catalog import Catalog, catalog
from frontend.startup import configure_logging, models_ready_line, note, ready_line

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
    pool = None
    try:
        served = catalog(config) if engine_client is None else Catalog(
            models={config.engine.model_name: config}, start_model=config.engine.model_name)
        first = iter([engine_client] if engine_client is not None else [])
        pool = ModelPool({name: model.engine for name, model in served.models.items()},
                         max_loaded=config.models_max, idle_unload_s=config.idle_unload, wait_s=config.models_wait,
                         on_demand=config.models_dir is not None, max_parked=config.models_parked,
                         make_client=lambda engine: next(first, None) or make_engine_client(engine))
        start = served.start_model
        if start is not None:
            engine = pool.model(start).config
            note("starting the engine: a scheduler and %d executor process(es) on %s",
                 engine.tensor_parallel_size * engine.data_parallel_size, engine.resolved_device)
            if not await _until_stopped(pool.load(start), stop):
                logger.info("stopped while the engine was starting")
                return
            note("loading the tokenizer and chat template")
        app = create_app(pool, config, served)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        page = getattr(app.state, "web_page_path", None)
        logger.info("%s", ready_line(pool.model(start).client, url, page) if start is not None
                    else models_ready_line(pool, config, url, page))
        expire = asyncio.ensure_future(_fail_unfinished_after(stop, pool, config.shutdown_timeout))
        try:
            await serve(app, hypercorn_config(config, sock.detach()), shutdown_trigger=stop.wait)
        finally:
            expire.cancel()
        logger.info("stopped serving; shutting the engines down")
    finally:
        if pool is not None:
            await pool.shutdown()
        sock.close()     # a no-op once hypercorn owns the descriptor
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _fail_unfinished_after(stop: asyncio.Event, pool: ModelPool, timeout: float) -> None:
    await stop.wait()
    await asyncio.sleep(timeout)
    if pool.num_unfinished:
        logger.info("%d requests did not finish within --shutdown-timeout (%g s); ending them",
                    pool.num_unfinished, timeout)
    pool.fail_unfinished(EngineDeadError(
        f"the server shut down before this request finished (--shutdown-timeout {timeout:g} s)"))


async def _until_stopped(work, stop: asyncio.Event) -> bool:
    """Await `work` (the engine's start runs in a daemon thread, so a signal can still stop the server); False
    when the server was stopped first."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
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
