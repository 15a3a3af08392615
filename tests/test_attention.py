"""Extraction of pre-softmax attention from local transformers models (offline)."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")  # part of the `data` extra

from softcert.analysis import attention  # noqa: E402

SENTENCES = ["The cat sat.", "A much longer sentence about attention heads and keys.", "Hi"]


@pytest.fixture(scope="module")
def minilm():
    return attention.extract_attention(sentences=SENTENCES, batch_size=3)


def test_minilm_shapes_and_masks(minilm):
    assert minilm.model_type == "bert" and not minilm.causal
    assert (minilm.n_layers, minilm.n_heads) == (6, 12)
    assert len(minilm.scores) == 3
    for s, v, toks in zip(minilm.scores, minilm.values, minilm.tokens):
        T = len(toks)
        assert s.shape == (6, 12, T, T) and v.shape == (6, 12, T, 32)
        assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
        assert torch.isfinite(s).all()  # padding cropped: every kept key is real
    lengths = minilm.lengths
    assert len(set(lengths)) == 3  # the batch was padded
    padded, key_mask, query_mask = minilm.padded()
    assert padded.shape == (3, 6, 12, max(lengths), max(lengths))
    for i, t in enumerate(lengths):
        assert key_mask[i].sum() == t
        assert torch.isneginf(padded[i, :, :, :t, t:]).all()


def test_softmax_of_scores_matches_model_attention(minilm):
    model, tok, _ = attention.load_model(attn_implementation="eager")
    enc = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    for i, s in enumerate(minilm.scores):
        t = s.shape[-1]
        mine = torch.softmax(s.double(), dim=-1)
        for layer in range(6):
            theirs = out.attentions[layer][i, :, :t, :].double()
            torch.testing.assert_close(mine[layer], theirs[:, :, :t], rtol=1e-5, atol=1e-6)
            # the model gives padded keys no mass either
            assert bool((theirs[:, :, t:] == 0).all())


def _tiny_gpt2(tmp_path):
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=30522)
    GPT2Model(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(attention.default_model_dir()).save_pretrained(tmp_path)
    return tmp_path


def test_gpt2_style_causal_masks(tmp_path):
    d = _tiny_gpt2(tmp_path)
    at = attention.extract_attention(d, sentences=SENTENCES[:2], max_length=32)
    assert at.model_type == "gpt2" and at.causal and (at.n_layers, at.n_heads) == (2, 4)
    model, tok, _ = attention.load_model(d, attn_implementation="eager")
    enc = tok(SENTENCES[:2], return_tensors="pt", padding=True, truncation=True, max_length=32)
    with torch.no_grad():  # no token_type_ids: GPT-2 would embed them (BERT's tokenizer here)
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    output_attentions=True)
    for i, s in enumerate(at.scores):
        t = s.shape[-1]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        assert torch.isneginf(s[..., future]).all() and torch.isfinite(s[..., ~future]).all()
        for layer in range(2):
            torch.testing.assert_close(
                torch.softmax(s[layer].double(), -1),
                out.attentions[layer][i, :, :t, :t].double(), rtol=1e-5, atol=1e-6,
            )


def test_packed_passages_have_fixed_length():
    at = attention.extract_attention(sentences=SENTENCES * 4, max_length=16, pack=True)
    assert all(n == 16 for n in at.lengths) and len(at.scores) >= 2
    assert all(t[0] == "[CLS]" and t[-1] == "[SEP]" for t in at.tokens)


def test_a_model_folder_without_a_tokenizer_is_refused(tmp_path):
    """transformers would build a tokenizer of special tokens only and read every word as
    [UNK] (issue 32); the folder is refused by name instead."""
    import shutil

    src = attention.default_model_dir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, tmp_path / name)
    with pytest.raises(ValueError, match=r"model_dir: .* has no tokenizer.*save_pretrained") as err:
        attention.load_model(tmp_path)
    assert str(tmp_path) in str(err.value) and "vocab.txt" in str(err.value)  # folder, file, fix


def test_unsupported_architecture_fails_clearly(tmp_path):
    from transformers import DistilBertConfig

    DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported architecture.*distilbert"):
        attention.extract_attention(tmp_path, sentences=["x"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_length"):
        attention.extract_attention(sentences=["x"], max_length=1)
    with pytest.raises(ValueError, match="sentences"):
        attention.extract_attention(sentences=[])
    with pytest.raises(ValueError, match="model_dir"):
        attention.extract_attention("/nonexistent/dir", sentences=["x"])
