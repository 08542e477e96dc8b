"""The ready line (frontend/startup.py): what a user checks first, with 'serving NAME on URL' first (tests and
tools find the URL there), and the browser page's URL once the app has one."""

from __future__ import annotations

from types import SimpleNamespace

from engine.config import EngineConfig
from tests.e2e.server import SERVING


def test_the_ready_line_says_model_dtype_context_kv_threads_and_url(tiny_model):
    from frontend.startup import ready_line

    config = EngineConfig(model=str(tiny_model), served_model_name="tiny", device="cpu", cpu_threads=3).finalize()
    engine = SimpleNamespace(config=config, num_blocks=65)          # 64 usable blocks of 16 tokens
    line = ready_line(engine, "http://127.0.0.1:8000")
    # tiny: 1 layer x (K, V) x 2 KV heads x head_dim 16 x 4 bytes = 256 B a token
    assert line == ("serving tiny on http://127.0.0.1:8000 | float32, context 512 tokens | KV cache 1024 tokens "
                    "(0 MiB) | 3 CPU threads per executor")
    assert config.kv_bytes_per_token() == 256
    assert SERVING.search(line).groups() == ("tiny", "http://127.0.0.1:8000")
    with_page = ready_line(engine, "http://127.0.0.1:8000", web_page_path="/")
    assert with_page.endswith("| chat in a browser at http://127.0.0.1:8000/")
