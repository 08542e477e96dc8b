"""The import rules of DESIGN §1 (the table in specs/layout-by-process.md §3.4), held by reading the AST.

Every module under engine/, frontend/, shm/, kernels/ and tools/ is parsed, imports inside functions
included; each import of a first-party module must be allowed by the importing module's row. Leaves stay
leaves, the engine never imports frontend/ or tools/, and each engine subpackage imports only what its
process may hold; in the frontend an API package imports the chat package and the frontend root, never
another API package (nor the app that assembles them). A second test pins that the scheduler process
never loads torch.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "frontend", "shm", "kernels", "tools")
CONTRACTS = ("engine.config", "engine.errors", "engine.sampling_params", "engine.messages", "engine.outputs",
             "engine.process", "engine.distributed", "engine.block_hash",
             "engine.structured_spec", "engine.generation_config")
MODEL_ARGS = ("engine.models.model_args", "engine.models.demo", "engine.models.bundled", "engine.models.hub",
              "engine.models.gguf_file", "engine.models.gguf_config", "engine.models.encoder_args",
              "engine.models.pooler_config", "engine.models.model_zip")     # torch-free model descriptions
ENGINE_FACE = ("engine!", "engine.config", "engine.sampling_params", "engine.outputs", "engine.errors",
               "engine.structured_spec", "engine.client")         # what the frontend may see of the engine
FRONTEND_MAY_USE = (*ENGINE_FACE, "frontend")
# The frontend: one package per API over the chat package and the root's shared modules; the app (with its
# OpenAPI document) and the server assemble the API packages, and only they (and the CLI) import them.
FRONTEND_APIS = ("frontend.openai", "frontend.anthropic", "frontend.responses", "frontend.ollama")
FRONTEND_ASSEMBLY = ("frontend.app", "frontend.openapi", "frontend.server")
FRONTEND_ROOT = ("frontend!", *(f"frontend.{p.stem}" for p in sorted((ROOT / "frontend").glob("*.py"))
                               if p.stem != "__init__" and f"frontend.{p.stem}" not in FRONTEND_ASSEMBLY))
FRONTEND_SHARED = (*ENGINE_FACE, *FRONTEND_ROOT, "frontend.chat")
# Several models (frontend/models/): the catalog, the one accessor by model name and the lifecycle routes,
# over the frontend root; only the assembly (and the CLI) import it.
FRONTEND_MODELS = "frontend.models"

# (row name, prefix of the importing module, prefixes it may import, prefixes it may import only lazily)
RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("shm is a leaf", "shm", ("shm",), ()),
    ("kernels is a leaf", "kernels", ("kernels",), ()),
    ("tools may import anything", "tools", PACKAGES, ()),
    ("frontend/cli", "frontend.cli", FRONTEND_MAY_USE, ()),
    *[("frontend's app assembly", name, FRONTEND_MAY_USE, ()) for name in FRONTEND_ASSEMBLY],
    *[(f"the API package {name.split('.')[1]}/", name, (*FRONTEND_SHARED, name), ()) for name in FRONTEND_APIS],
    ("frontend/chat", "frontend.chat", FRONTEND_SHARED, ()),
    ("frontend/models", FRONTEND_MODELS, (*FRONTEND_SHARED, FRONTEND_MODELS), ()),
    ("frontend/web (the chat page's files: static, it talks to the APIs over HTTP)", "frontend.web",
     ("frontend.web",), ()),
    ("frontend root", "frontend", FRONTEND_SHARED, ()),
    ("engine/attention", "engine.attention", ("engine.attention", "kernels", *CONTRACTS), ()),
    ("engine/layers", "engine.layers", ("engine.layers", "kernels", *CONTRACTS), ()),
    ("engine/models", "engine.models", ("engine.models", "engine.layers", "engine.attention", "kernels",
                                         *CONTRACTS), ()),
    ("engine/sample", "engine.sample", ("engine.sample", "engine.sampling_params", "engine.errors"), ()),
    ("engine/executor", "engine.executor", ("engine.executor", "engine.sample", "engine.models",
                                             "engine.attention", "engine.layers", "kernels", "shm",
                                             *CONTRACTS), ()),
    ("engine/core", "engine.core", ("engine.core", "engine.executor.group", "shm", *CONTRACTS),
     ("engine.client.tokenizer",)),                                     # the grammar compile worker only
    ("engine/client", "engine.client", ("engine.client", "shm", *CONTRACTS),
     ("engine.core.inproc",)),                                          # in-process mode only
    ("engine/llm.py", "engine.llm", ("engine.client", *CONTRACTS), ()),
    ("engine façade (lazy names only)", "engine.__init__", (), ()),
    ("engine root contracts", "engine", ("shm", *CONTRACTS, *MODEL_ARGS), ()),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)


def first_party_imports(source: str, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level?) for every first-party import in the source."""
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    for node in tree.body:                      # imports under `if`/`try` at module level run at import too
        if isinstance(node, (ast.If, ast.Try)):
            top_level.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:                      # relative: resolve against the importing package
                base = module.split(".")[: -node.level]
                names = [".".join(base + ([node.module] if node.module else []))]
            elif node.module:
                names = [node.module]
                names += [f"{node.module}.{alias.name}" for alias in node.names
                          if (ROOT / node.module.replace(".", "/") / f"{alias.name}.py").exists()]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                found.append((name, node.lineno, id(node) in top_level))
    return found


def rule_for(module: str):
    for rule in RULES:
        prefix = rule[1]
        if module == prefix or module.startswith(prefix + "."):
            return rule
    raise AssertionError(f"no import rule covers {module}; add its row to RULES and DESIGN §1")


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    """A prefix allows itself and its submodules; 'engine!' allows the package (the façade) alone."""
    return any(name == p.rstrip("!") or (not p.endswith("!") and name.startswith(p + ".")) for p in prefixes)


def violations(module: str, source: str) -> list[str]:
    row, _, allowed, lazy_only = rule_for(module)
    bad = []
    for name, line, top in first_party_imports(source, module):
        if name == module or _allowed(name, allowed):
            continue
        if not top and _allowed(name, lazy_only):
            continue
        if module.startswith("engine.") and name in ("engine",):
            continue                             # the façade package itself (its __init__ imports nothing)
        bad.append(f"{module}:{line} imports {name} ({row} may import {', '.join(allowed) or 'nothing'})")
    return bad


def all_modules() -> list[tuple[str, Path]]:
    return [(module_name(p), p) for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_every_import_follows_the_layer_table():
    bad = [v for module, path in all_modules() for v in violations(module, path.read_text())]
    assert not bad, "imports against the layer table (DESIGN §1):\n" + "\n".join(bad)


def test_a_planted_reverse_import_is_caught():
    """The check can fail: each of these would run against the intended direction."""
    planted = {
        "engine.config": "from tools.bench_serve import cli\n",                       # engine -> tools
        "engine.core.scheduler": "import torch\nfrom engine.executor.main import main\n",  # core -> executor proc
        "engine.client.engine_client": "from engine.core.scheduler import Scheduler\n",    # client -> core
        "shm.ring": "from engine.messages import Codec\n",                            # leaf -> engine
        "engine.sample.sampler": "from engine.messages import SchedulerOutput\n",
        "frontend.metrics": "from engine.messages import FINISH_STOP\n",               # frontend -> wire module
        "engine.outputs": "def f():\n    from frontend.errors import ApiError\n",    # lazy engine -> frontend
        "frontend.anthropic.messages": "from frontend.openai.wire import OpenAIWire\n",   # API -> another API
        "frontend.responses.handlers": "def f():\n    from frontend.anthropic import messages\n",
        "frontend.chat.preparation": "from frontend.openai.protocol import CompletionRequest\n",  # chat -> API
        "frontend.runner": "from frontend.responses.store import ResponseStore\n",    # root -> API
        "frontend.openai.chat": "from frontend.app import create_app\n",              # API -> the assembly
        "frontend.openai.completions": "from frontend.models.registry import ServedModels\n",   # API -> models
        "frontend.models.registry": "from frontend.openai.logprobs import TokenStrings\n",      # models -> API
        "frontend.ollama.wire": "from frontend.openai.wire import OpenAIWire\n",       # Ollama -> OpenAI's package
        "frontend.ollama.handlers": "from frontend.anthropic.translate import to_chat_request\n",
        "frontend.chat.output": "from frontend.ollama.wire import OllamaWire\n",        # chat -> an API
        "frontend.web.page": "from frontend.ollama.handlers import OllamaServing\n",   # the page -> an API
    }
    for module, source in planted.items():
        assert violations(module, source), f"planted import in {module} was not caught"


def test_lazy_exemptions_stay_lazy():
    source = "from engine.core.inproc import InProcessEngine\n"
    assert violations("engine.client.engine_client", source)
    assert not violations("engine.client.engine_client", "def start():\n    " + source)


def test_the_scheduler_process_never_imports_torch():
    code = ("import sys, engine.core.main, engine.core.scheduler, engine.executor.group\n"
            "loaded = [m for m in ('torch', 'transformers', 'triton') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_engine_root_holds_at_most_a_dozen_modules():
    modules = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(modules) <= 12, modules


def test_the_frontend_root_holds_at_most_14_modules_and_a_package_per_api():
    modules = sorted(p.name for p in (ROOT / "frontend").glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 14, modules
    packages = {p.parent.name for p in (ROOT / "frontend").glob("*/__init__.py")}
    assert {"openai", "anthropic", "responses", "ollama", "chat", "cli", "web"} <= packages
    assert {f"frontend.{name}" for name in packages} - {"frontend.chat", "frontend.cli", "frontend.web",
                                                        FRONTEND_MODELS} \
        == set(FRONTEND_APIS), \
        "a new frontend package needs its row in RULES (an API package: FRONTEND_APIS) and DESIGN §1"
