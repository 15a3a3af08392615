"""Certified top-k truncation on the attention of all-MiniLM-L6-v2 (offline).

    python examples/topk_minilm.py

Extracts pre-softmax scores for a few sentences, then per layer: the certified minimal k at
ε = 0.01 (tail mass <= ε, outward rounded), and the attention-output error of truncating to
it with its diameter bound. The full study is `softcert topk`.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from softcert.analysis import attention, topk  # noqa: E402

torch.set_num_threads(1)
sentences = [
    "Certified top-k attention keeps only the keys that matter.",
    "The river changes colour after heavy rain upstream.",
]
at = attention.extract_attention(sentences=sentences)
for i, (scores, values) in enumerate(zip(at.scores, at.values)):
    n = scores.shape[-1]
    print(f"sentence {i}: {n} tokens")
    for layer in range(at.n_layers):
        s = scores[layer].double()  # (heads, queries, keys)
        cert = topk.certify_topk(s, 0.01)
        err = topk.output_error_bound(s, values[layer].double().unsqueeze(-3), cert.k)
        print(f"  layer {layer}: mean k = {cert.k.double().mean():5.2f} of {n}, "
              f"max tail bound {cert.tail_upper.max():.4f}, "
              f"mean |err| {err.exact.mean():.4f} <= diameter bound {err.diameter.mean():.4f}")
