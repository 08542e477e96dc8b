"""Tiny random-weight encoder models in sentence-transformers' layout, built in the test (no download).

`make_tiny_encoder(arch, path, pooling=..., normalize=...)` saves a 2-layer BertModel / RobertaModel /
XLMRobertaModel (fp32 safetensors, config.json; HF's pooler included, which pooling must ignore), a WordPiece
tokenizer over a small vocabulary (letters, digits, punctuation, a few words, and every letter as a "##"
continuation, so any ASCII text tokenizes), and the sentence-transformers files (modules.json, the Pooling
module's config in the legacy boolean form or the newer `pooling_mode` string, sentence_bert_config.json).
sentence-transformers loads the directory as it would a hub model: it is the reference.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "is", "of", "and", "to", "in", "man", "food", "eating", "bread", "horse", "riding", "girl",
         "baby", "paris", "france", "capital", "def", "return", "print", "self"]
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
WEIGHT_STD = 0.1
LEGACY_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "lasttoken": "pooling_mode_lasttoken"}


def vocabulary() -> list[str]:
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    return SPECIALS + chars + WORDS + [f"##{c}" for c in string.ascii_lowercase + string.digits]


def make_tiny_encoder(arch: str, path: str | Path, *, pooling: str = "mean", normalize: bool = True,
                      max_seq_length: int | None = 32, legacy: bool = True, seed: int = 0) -> Path:
    """Save a tiny `arch` encoder with sentence-transformers files into `path`; returns it."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import AutoConfig, AutoModel, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    wordpiece = BertWordPieceTokenizer({token: i for i, token in enumerate(vocab)}, lowercase=True)
    PreTrainedTokenizerFast(tokenizer_object=wordpiece._tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                            model_max_length=CONFIG["max_position_embeddings"]).save_pretrained(path)
    model_type = {"BertModel": "bert", "RobertaModel": "roberta", "XLMRobertaModel": "xlm-roberta"}[arch]
    extra = {"pad_token_id": 0, "max_position_embeddings": CONFIG["max_position_embeddings"] + 1,
             "type_vocab_size": 1} if model_type != "bert" else {}
    config = AutoConfig.for_model(model_type, vocab_size=len(vocab), **{**CONFIG, **extra})
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModel.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(WEIGHT_STD * torch.randn_like(param))
    model.save_pretrained(path)
    write_sentence_transformers_files(path, CONFIG["hidden_size"], pooling, normalize, max_seq_length, legacy)
    return path


def write_sentence_transformers_files(path: Path, dim: int, pooling: str, normalize: bool,
                                      max_seq_length: int | None, legacy: bool = True) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    if legacy:
        pooling_config = {"word_embedding_dimension": dim, **{key: mode == pooling for mode, key in LEGACY_KEYS.items()}}
    else:
        pooling_config = {"embedding_dimension": dim, "pooling_mode": pooling, "include_prompt": True}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    if max_seq_length is not None:
        (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                     "do_lower_case": False}))


def st_embeddings(path: str | Path, texts: list[str]):
    """sentence-transformers' float32 embeddings of texts (the reference)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return model.encode(texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False)


@pytest.fixture(scope="session", name="tiny_encoder")
def tiny_encoder_fixture(tmp_path_factory):
    """tiny_encoder(arch, **options) -> a saved encoder directory, built once per session per variant."""
    built: dict[tuple, Path] = {}

    def build(arch: str = "BertModel", **options) -> Path:
        key = (arch, tuple(sorted(options.items())))
        if key not in built:
            built[key] = make_tiny_encoder(arch, tmp_path_factory.mktemp(arch), **options)
        return built[key]

    return build
