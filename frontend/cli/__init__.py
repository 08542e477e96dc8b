"""The `ringserve` command line (click).

Subcommands are imported only when invoked, so `ringserve --help` stays fast and a command's heavy
imports (torch, transformers) are paid only by the command that needs them. Each entry maps a name to
"module:attribute" of a click command.
"""

from __future__ import annotations

import importlib

import click

from frontend import version

COMMANDS: dict[str, str] = {
    "serve": "frontend.cli.serve:serve",
    "chat": "frontend.cli.chat:chat",
    "generate": "frontend.cli.generate:generate",
}

BENCH_COMMANDS: dict[str, str] = {
    "throughput": "tools.bench_offline:cli",
    "scheduler": "tools.bench_scheduler:cli",
    "serve": "tools.bench_serve:cli",
    "grammar": "tools.bench_grammar:cli",
    "ipc": "tools.bench_ipc:cli",
    "latency": "tools.bench_latency:cli",
    "frontend": "tools.bench_frontend:cli",
    "ollama": "tools.bench_ollama:cli",
    "engine-overhead": "tools.bench_engine_overhead:cli",
    "embed": "tools.bench_embed:cli",
    "spec": "tools.bench_spec:cli",
    "spec-cost": "tools.bench_spec_cost:cli",
    "swap": "tools.bench_swap:cli",
}


class LazyGroup(click.Group):
    def __init__(self, *args, lazy: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx, name):
        if name in self._lazy:
            module, attr = self._lazy[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version(), prog_name="ringserve")
def main() -> None:
    """ringserve: an LLM inference and serving engine on shared-memory rings."""


@main.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks: each prints its figures, and side-by-side ratios where a peer exists."""

