"""A model folder without a usable tokenizer is refused by name (issue 32).

Without a vocabulary file transformers builds a tokenizer of special tokens only: BERT reads
every word as [UNK], GPT-2 as nothing. The refusal must name the folder, the missing file and
the fix, and come before the weights are read.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")  # part of the `data` extra

from softcert.analysis import attention  # noqa: E402


def test_refused_before_the_weights_load(tmp_path):
    """config.json only: no weights either, yet the tokenizer is what the error names."""
    shutil.copy(attention.default_model_dir() / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="model_dir") as err:
        attention.extract_attention(tmp_path, sentences=["The cat sat."])
    msg = str(err.value)
    assert str(tmp_path) in msg  # the folder
    assert "no tokenizer" in msg and "tokenizer.json" in msg and "vocab.txt" in msg  # what is missing
    assert "tokenizer.save_pretrained(model_dir)" in msg  # the fix


def test_bpe_vocab_without_merges_is_refused(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=4).save_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
    with pytest.raises(ValueError, match=r"model_dir: .* has vocab.json but no merges.txt.*save_pretrained"):
        attention.load_model(tmp_path)


def test_a_folder_with_its_tokenizer_reads_words(tmp_path):
    """The check refuses nothing usable: MiniLM's tokenizer copied beside a tiny BERT, and the
    extracted tokens are real words, not [UNK]."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    cfg = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    BertModel(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(attention.default_model_dir()).save_pretrained(tmp_path)
    at = attention.extract_attention(tmp_path, sentences=["The cat sat."], max_length=16)
    assert at.tokens[0] == ("[CLS]", "the", "cat", "sat", ".", "[SEP]")
