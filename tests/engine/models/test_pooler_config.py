"""Reading a model's pooling from its sentence-transformers files: both config forms, defaults, refusals."""

from __future__ import annotations

import json

import pytest

from engine.errors import ConfigError
from engine.models.pooler_config import (
    PoolerConfig,
    read_max_seq_length,
    read_sentence_transformers,
    resolve_pooler_config,
)
from tests.engine.pooling_models import write_sentence_transformers_files


@pytest.mark.parametrize("legacy", [True, False], ids=["boolean-keys", "pooling_mode"])
@pytest.mark.parametrize(("mode", "expected"), [("mean", "MEAN"), ("cls", "CLS"), ("lasttoken", "LAST")])
def test_pooling_mode_and_normalize_from_the_files(tmp_path, legacy, mode, expected):
    write_sentence_transformers_files(tmp_path, 8, mode, normalize=mode != "cls", max_seq_length=64, legacy=legacy)
    assert read_sentence_transformers(str(tmp_path)) == (expected, mode != "cls")
    assert read_max_seq_length(str(tmp_path)) == 64


def test_defaults_without_sentence_transformers_files(tmp_path):
    assert read_sentence_transformers(str(tmp_path)) is None and read_max_seq_length(str(tmp_path)) is None
    encoder = resolve_pooler_config(str(tmp_path), {}, encoder=True, user=None)
    decoder = resolve_pooler_config(str(tmp_path), {}, encoder=False, user=None)
    assert (encoder.pooling_type, encoder.normalize) == ("CLS", True)        # vLLM's defaults
    assert (decoder.pooling_type, decoder.normalize) == ("LAST", True)


def test_the_users_pooler_config_wins(tmp_path):
    write_sentence_transformers_files(tmp_path, 8, "mean", normalize=True, max_seq_length=None)
    config = resolve_pooler_config(str(tmp_path), {}, encoder=True, user=PoolerConfig(pooling_type="cls",
                                                                                      normalize=False))
    assert (config.pooling_type, config.normalize) == ("CLS", False)
    with pytest.raises(ConfigError, match="pooling_type must be one of MEAN, CLS, LAST"):
        resolve_pooler_config(str(tmp_path), {}, encoder=True, user=PoolerConfig(pooling_type="MAX"))
    with pytest.raises(ConfigError, match="not supported for decoder models"):
        resolve_pooler_config(str(tmp_path), {}, encoder=False, user=None)       # the files say MEAN


def test_matryoshka_dimensions_from_config_json():
    assert resolve_pooler_config(None, {"matryoshka_dimensions": [64, 128]}, True, None).matryoshka_dimensions == [64, 128]
    assert resolve_pooler_config(None, {"is_matryoshka": True}, True, None).matryoshka_dimensions is None
    assert resolve_pooler_config(None, {}, True, None).matryoshka_dimensions == []


@pytest.mark.parametrize(("modules", "pooling", "message"), [
    ([{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}], {"pooling_mode": "mean"},
     "Dense module"),
    ([], {"pooling_mode_max_tokens": True}, "pooling mode pooling_mode_max_tokens is not supported"),
    ([], {"pooling_mode": ["mean", "cls"]}, "2 pooling modes"),
    ([], {"pooling_mode": "mean", "include_prompt": False}, "include_prompt"),
])
def test_what_the_engine_cannot_run_is_refused(tmp_path, modules, pooling, message):
    pipeline = [{"type": "sentence_transformers.models.Transformer", "path": ""},
                {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}, *modules]
    (tmp_path / "modules.json").write_text(json.dumps(pipeline))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(ConfigError, match=message):
        read_sentence_transformers(str(tmp_path))
