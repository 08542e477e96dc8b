"""Hugging Face hub repo ids as MODEL: resolved to a local snapshot directory before any process starts.

`snapshot_download` fetches only what the engine reads (config, generation config, tokenizer files, chat
template, safetensors) into the hub cache (or --download-dir), reuses what is cached, and shows its
progress bars. HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are read when the model is resolved, not when
huggingface_hub is imported. Each failure becomes one ConfigError that says what went wrong and what to
do: no network, a gated or private repo (401/403), no such repo or revision (404), no safetensors.
"""

from __future__ import annotations

import glob
import os
import re

from engine.errors import ConfigError

ALLOW_PATTERNS = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "*.safetensors", "model.safetensors.index.json",
]
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*")


def looks_like_repo_id(model: str) -> bool:
    """'Qwen/Qwen3-0.6B' is a repo id when no such local path exists; './x', '/x/y', 'a/b/c' are paths."""
    return bool(_REPO_ID.fullmatch(model)) and not model.endswith(".gguf") and not os.path.exists(model)


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve_repo(repo_id: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """The local directory of `repo_id` at `revision`, downloaded into the cache when not there yet."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    offline = _truthy("HF_HUB_OFFLINE")
    at = f" at revision {revision!r}" if revision else ""
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=download_dir, endpoint=endpoint,
                                 token=os.environ.get("HF_TOKEN") or None, local_files_only=offline,
                                 allow_patterns=ALLOW_PATTERNS)
    except GatedRepoError as e:
        status = e.response.status_code if e.response is not None else "401"
        why = "no token was sent" if status == 401 else "the token (HF_TOKEN) has not been granted access"
        raise ConfigError(f"{repo_id} is a gated repo and {why} ({status}): accept its terms on the hub, then "
                          "set HF_TOKEN to a token of that account") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{repo_id} has no revision {revision!r} (404) on {endpoint}") from None
    except RepositoryNotFoundError as e:
        status = e.response.status_code if e.response is not None else 404
        raise ConfigError(f"model {repo_id!r} is neither a local path nor a repo on {endpoint} ({status}: not "
                          "found; if it is private, set HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        if offline:
            raise ConfigError(f"HF_HUB_OFFLINE is set and {repo_id}{at} is not in the hub cache "
                              f"({download_dir or 'the default cache'}); unset it to download") from None
        raise ConfigError(f"cannot reach the Hugging Face hub at {endpoint} to download {repo_id}{at}, and it is "
                          "not in the cache (no network? set HF_ENDPOINT for a mirror)") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise ConfigError(f"downloading {repo_id}{at} from {endpoint} failed ({status}): {e}") from None
    except OSError as e:
        raise ConfigError(f"downloading {repo_id}{at} from {endpoint} failed: {e}") from None
    if not glob.glob(os.path.join(path, "*.safetensors")):
        raise ConfigError(f"{repo_id}{at} has no safetensors weights (ringserve loads *.safetensors, or a .gguf "
                          "file given by its path)")
    return path
