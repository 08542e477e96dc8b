"""How long one long prompt stalls a running server: send it, probe /health every 50 ms meanwhile, and print
the longest /health round trip beside the prompt's own answer and time.

    python -m tools.probe_long_prompt --url http://127.0.0.1:8000 --chars 16000000
    python -m tools.probe_long_prompt --url http://127.0.0.1:8000 --chars 600000 --route chat

A server whose event loop is held by tokenization answers /health only after the prompt is done; one that
tokenizes off the loop (and refuses prompts certain to exceed the context before tokenizing) keeps
answering in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import httpx

WORDS = "lorem ipsum dolor sit amet "


def probe(url: str, chars: int, route: str, api_key: str | None) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = WORDS * (chars // len(WORDS))
    if route == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    else:
        path, body = "/v1/completions", {"prompt": text, "max_tokens": 1}
    latencies: list[float] = []
    done = threading.Event()

    def health() -> None:
        with httpx.Client(timeout=600) as client:
            while not done.is_set():
                start = time.monotonic()
                client.get(url + "/health")
                latencies.append(time.monotonic() - start)
                time.sleep(0.05)

    prober = threading.Thread(target=health)
    prober.start()
    start = time.monotonic()
    response = httpx.post(url + path, json=body, headers=headers, timeout=600)
    elapsed = time.monotonic() - start
    done.set()
    prober.join()
    return {"status": response.status_code, "answer": response.text[:160], "prompt_seconds": round(elapsed, 3),
            "health_probes": len(latencies), "longest_health_seconds": round(max(latencies), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--chars", type=int, default=16_000_000, help="prompt length in characters")
    parser.add_argument("--route", choices=("completions", "chat"), default="completions")
    args = parser.parse_args()
    keys = os.environ.get("RINGSERVE_API_KEY", "").split()
    for key, value in probe(args.url, args.chars, args.route, keys[0] if keys else None).items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
