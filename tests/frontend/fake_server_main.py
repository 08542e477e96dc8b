"""`python -m tests.frontend.fake_server_main MODEL_DIR`: launch_server over a FakeEngine, as a process.

Lets tests send real signals to a real server process without an engine. After launch_server returns it
prints one JSON line saying whether the engine was shut down and which requests were aborted.
"""

from __future__ import annotations

import argparse
import json

from frontend.config import ServerConfig
from frontend.server import launch_server
from tests.frontend.fake_engine import FakeEngine
from tests.frontend.harness import engine_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.01)
    parser.add_argument("--shutdown-timeout", type=float, default=5.0)
    parser.add_argument("--coalesce", action="store_true", help="merge steps a slow consumer has not taken")
    args = parser.parse_args()
    fake = FakeEngine(engine_config(args.model_dir), step_delay=args.step_delay, coalesce=args.coalesce)
    config = ServerConfig(port=args.port, shutdown_timeout=args.shutdown_timeout, log_stats_interval=0.5,
                          engine=fake.config)
    launch_server(config, engine_client=fake)
    print(json.dumps({"started": fake.started, "shut_down": fake.shut_down, "aborted": fake.aborted,
                      "finished": fake.finished}), flush=True)


if __name__ == "__main__":
    main()
