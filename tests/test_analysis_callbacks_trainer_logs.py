"""SafeStepCallback's metrics reach transformers.Trainer's own log, state.log_history (issue 32).

A tiny BERT built from a config (nothing downloaded) trains 4 steps on CPU, logging every 2nd
step; report_to=[] so no integration runs. Trainer.log appends its copy of ``logs`` to
state.log_history before calling the callbacks, so the callback must reach that copy too.
"""
from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")


def _dataset(n=16, seq=8, vocab=40):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(seq, dtype=torch.long),
             "labels": int(ids[i, 0] % 3)} for i in range(n)]


def test_safestep_metrics_in_trainer_log_history(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    from softcert.analysis.callbacks import SafeStepCallback

    class Seen(TrainerCallback):  # a reporting callback after SafeStep (as wandb, tensorboard)
        logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=3))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-3, report_to=[], save_strategy="no", logging_strategy="steps",
                             logging_steps=2, disable_tqdm=True, use_cpu=True, dataloader_num_workers=0)
    cb = SafeStepCallback()
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(), callbacks=[cb, Seen()])
    trainer.train()

    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logged] == [2, 4]
    for e in logged:
        scale, ratio = e["safestep_scale"], e["safestep_ratio"]
        assert math.isfinite(scale) and 0.0 < scale <= 1.0
        assert math.isfinite(ratio) and ratio > 0.0
        step = cb.history[e["step"] - 1]  # the step that was logged, not a stale one
        assert (scale, ratio) == pytest.approx((step.scale, step.ratio), rel=1e-12)
    seen = [e for e in Seen.logs if "loss" in e]
    assert [e["safestep_scale"] for e in seen] == [e["safestep_scale"] for e in logged]
