"""extract_attention's output piped into topk.output_error_bound unchanged (issue 32).

Oracle: top-k attention error recomputed in float64 from the extracted float32 tensors
(softmax over the unmasked keys, keep the k largest scores, renormalise, P·V), anchored to
the model itself: float64 P·V of the extracted tensors equals the context vectors MiniLM's
self-attention computes (float32 tolerance), so "values shared by every query" is the
reading the model uses.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")  # part of the `data` extra

from softcert.analysis import attention, topk  # noqa: E402

SENTENCES = ["The cat sat on the mat.", "Attention heads weigh keys by softmax of scores."]


def reference_error(s: torch.Tensor, v: torch.Tensor, k: int):
    """(‖P·V - P̂_k·V‖₂ per query row, τ_k) in float64; s (..., Q, n), v (..., n, d) shared."""
    s, v = s.double(), v.double()
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1]).expand_as(order))
    head = (ranks < k) & torch.isfinite(s)
    p = torch.softmax(s, dim=-1)
    p_hat = torch.softmax(s.masked_fill(~head, float("-inf")), dim=-1)
    err = torch.linalg.vector_norm(p @ v - p_hat @ v, dim=-1)
    return err, (p * ~head).sum(-1)


def check_piped(s, v, k):
    """output_error_bound(s, v, k) as extract_attention gives them, against the reference."""
    res = topk.output_error_bound(s, v, k)
    ref, tau = reference_error(s, v, k)
    assert res.exact.shape == ref.shape == s.shape[:-1]
    scale = float(v.double().norm(dim=-1).max())
    torch.testing.assert_close(res.exact, ref, rtol=1e-9, atol=1e-12 * scale)
    slack = 1e-12 * scale  # the reference itself is a float64 estimate
    for name in ("diameter", "variance", "norm"):
        bound = getattr(res, name)
        assert bool((ref <= bound + slack).all()), name
    assert bool((tau <= res.tail_upper + 1e-15).all())
    return res, ref


@pytest.fixture(scope="module")
def minilm():
    return attention.extract_attention(sentences=SENTENCES, batch_size=2)


def test_minilm_values_go_into_output_error_bound_unchanged(minilm):
    nontrivial = 0
    for s, v in zip(minilm.scores, minilm.values):
        T = s.shape[-1]
        assert s.shape == (6, 12, T, T) and v.shape == (6, 12, T, 32)  # what the issue passed
        for k in (1, 3, T // 2):
            _, ref = check_piped(s, v, k)
            nontrivial += int((ref > 1e-3).sum())
    assert nontrivial > 100  # the bounds were checked on real, non-zero errors


def test_extracted_values_are_read_as_the_model_reads_them(minilm):
    """The model's own self-attention context vectors are softmax(scores)·values with values
    shared across the query axis: the reading output_error_bound gives same-rank values."""
    model, tok, _ = attention.load_model(attn_implementation="eager")
    ctx = {}
    hooks = [layer.attention.self.register_forward_hook(
        lambda mod, args, out, i=i: ctx.__setitem__(i, out[0].detach()))
        for i, layer in enumerate(model.encoder.layer)]
    enc = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        model(**enc)
    for h in hooks:
        h.remove()
    for b, (s, v) in enumerate(zip(minilm.scores, minilm.values)):
        T = s.shape[-1]
        mine = torch.softmax(s.double(), -1) @ v.double()  # (L, H, T, d)
        for layer in range(6):
            theirs = ctx[layer][b, :T].double().reshape(T, 12, 32).transpose(0, 1)
            torch.testing.assert_close(mine[layer], theirs, rtol=1e-4, atol=1e-5)


def test_old_value_layouts_give_the_same_answer(minilm):
    s, v = minilm.scores[0][:2], minilm.values[0][:2]  # two layers keep it small
    T = s.shape[-1]
    new = topk.output_error_bound(s, v, 2)
    for old in (v.unsqueeze(-3), v.unsqueeze(-3).expand(2, 12, T, T, 32)):  # singleton, per query
        res = topk.output_error_bound(s, old, 2)
        for name in ("exact", "diameter", "variance", "norm"):
            torch.testing.assert_close(getattr(res, name), getattr(new, name), rtol=1e-12, atol=0.0)


def test_mismatched_values_name_the_argument(minilm):
    s, v = minilm.scores[0], minilm.values[0]
    with pytest.raises(ValueError, match="values"):
        topk.output_error_bound(s, v[..., :-1, :], 2)  # one key short
    with pytest.raises(ValueError, match="values"):
        topk.output_error_bound(s, v[:1, :5], 2)  # heads 5 vs 12: batch does not broadcast


def test_causal_gpt2_with_masked_keys(tmp_path):
    """GPT-2 scores carry -inf on future keys; early rows have fewer valid keys than k."""
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=30522)
    GPT2Model(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(attention.default_model_dir()).save_pretrained(tmp_path)
    at = attention.extract_attention(tmp_path, sentences=SENTENCES, max_length=32)
    for s, v in zip(at.scores, at.values):
        assert torch.isneginf(s).any()
        for k in (1, 4):
            res, ref = check_piped(s, v, k)
            assert bool((res.exact[..., :k] == 0).all())  # rows with <= k keys: exact truncation
