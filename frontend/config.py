"""ServerConfig: the HTTP server's options plus the one EngineConfig that flows into the engine."""

from __future__ import annotations

import msgspec

from engine.config import ConfigError, EngineConfig

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")
REASONING_PARSERS = ("qwen3", "deepseek_r1")
REASONING_FIELDS = ("reasoning", "reasoning_content", "both")
MiB = 1 << 20


class ServerConfig(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | list[str] | None = None   # when set, every route but /health needs "Bearer <key>" (one of
                                             # them); with several, each key has its own Responses store
    allowed_origins: list[str] = []          # CORS; empty: no CORS headers at all
    allowed_hosts: list[str] = []            # Host names accepted besides loopback ones (DNS rebinding);
                                             # a server on a non-loopback address accepts any unless set
    body_read_timeout: float = 30.0          # seconds a client has to send a whole request body
    max_concurrent_requests: int = 1024      # HTTP requests in progress; more get 503 (/health excepted)
    chat_template: str | None = None         # a file path or the template itself; default: the tokenizer's
    shutdown_timeout: float = 5.0            # seconds in-flight requests may finish after SIGTERM
    enable_access_log: bool = False
    log_level: str = "info"
    profile_dir: str | None = None           # where /start_profile writes traces; None: profiling disabled
    max_request_body_bytes: int = 16 * MiB   # larger bodies get 413
    max_header_bytes: int = 16 * 1024        # request line + headers; larger requests are refused
    log_stats_interval: float = 5.0          # seconds between "engine busy" log lines; 0 disables them
    # The Responses API's store (previous_response_id, GET /v1/responses/{id}): bounded and expiring.
    responses_store_max_entries: int = 1024
    responses_store_max_bytes: int = 256 * MiB
    responses_store_ttl: float = 3600.0      # seconds a stored response is kept
    # tool calling and reasoning (vLLM's flags)
    enable_auto_tool_choice: bool = False    # tool_choice "auto" (needs tool_call_parser)
    tool_call_parser: str | None = None      # how calls are read from the output, and forced
    exclude_tools_when_tool_choice_none: bool = False
    reasoning_parser: str | None = None      # split <think> reasoning out of the output
    reasoning_field: str = "reasoning"       # response field(s) of the reasoning: vLLM's, DeepSeek's, both
    default_chat_template_kwargs: dict = {}  # under each request's chat_template_kwargs
    # several models (frontend/models/): a model per GGUF file or config.json directory in models_dir
    models_dir: str | None = None
    models_max: int | None = None            # engines loaded at once (least recently used unloaded first);
                                             # None: as many as there are models
    idle_unload: float | None = None         # seconds unused after which a model's engine stops
    models_parked: int = 0                   # engines kept asleep at level 2 (processes, no weights) when
                                             # their model makes room for another: a swap back is a wake
    models_wait: float = 60.0                # seconds a request waits for room before a 503
    web_ui: bool = True                      # the chat page at / (--no-web-ui: off)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    engine_flags: EngineConfig | None = None   # the engine flags as given (not finalized): what the models
                                               # of models_dir start from, under their settings files

    @property
    def api_keys(self) -> list[str]:
        if self.api_key is None:
            return []
        return [self.api_key] if isinstance(self.api_key, str) else list(self.api_key)

    def validate(self) -> ServerConfig:
        """Check the server's own options (the engine's are checked by EngineConfig.finalize)."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}; got {self.log_level!r}")
        if self.shutdown_timeout < 0:
            raise ConfigError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        for name in ("max_request_body_bytes", "max_header_bytes", "responses_store_ttl", "body_read_timeout",
                     "max_concurrent_requests"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("responses_store_max_entries", "responses_store_max_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if "" in self.api_keys or (isinstance(self.api_key, list) and not self.api_key):
            raise ConfigError("api_key must not be empty")
        for name, allowed in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.reasoning_field not in REASONING_FIELDS:
            raise ConfigError(f"reasoning_field must be one of {', '.join(REASONING_FIELDS)}; "
                              f"got {self.reasoning_field!r}")
        if self.models_max is not None and self.models_max < 1:
            raise ConfigError(f"models_max must be at least 1, got {self.models_max}")
        if self.models_parked < 0:
            raise ConfigError(f"models_parked must be >= 0, got {self.models_parked}")
        for name in ("idle_unload", "models_wait"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser")
        return self
