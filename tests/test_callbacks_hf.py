"""SafeStepCallback in a Hugging Face Trainer: a tiny BERT (built from a config, nothing
downloaded) trains a few steps with gradient accumulation; after an LR spike x1000 the
controller binds (scale < 1) and the spiked steps move the weights by at most rho_a."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch


def _dataset(n=32, seq=8, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    labels = (ids[:, 0] % 3).long()
    return [{"input_ids": ids[i], "attention_mask": torch.ones(seq, dtype=torch.long), "labels": labels[i]}
            for i in range(n)]


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, num_labels=3)
    return BertForSequenceClassification(cfg)


def _check_history(hist, steps=6, spike_at=3):
    assert len(hist) == steps and all(s.measured and s.batches == 2 for s in hist)  # both micro-batches
    assert all(s.scale == 1.0 for s in hist[:spike_at])  # lr 1e-3: the controller leaves the steps alone
    for s in hist[spike_at:]:  # lr 1: it binds, and the applied step is target_ratio * rho_a
        assert s.scale < 1.0
        assert s.scale * s.update_norm == pytest.approx(s.rho_a, rel=1e-9)


def test_callback_binds_on_lr_spike_in_trainer_event_loop():
    """The Trainer's own CallbackHandler drives the events in the order Trainer.train calls
    them (on_train_begin; per optimizer step: micro-batch forwards and backwards,
    on_pre_optimizer_step, optimizer.step, on_optimizer_step, scheduler step), with
    gradient accumulation 2 and the model returning a ModelOutput."""
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    from softcert.analysis.callbacks import SafeStepCallback

    model = _tiny_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1000.0 if s >= 3 else 1.0)
    cb = SafeStepCallback()
    handler = CallbackHandler([cb], model, None, opt, sched)
    state, control = TrainerState(), TrainerControl()
    data = _dataset()
    model.train()
    control = handler.on_train_begin(None, state, control)
    for step in range(6):
        for micro in range(2):
            rows = data[(4 * (2 * step + micro)) % 32:][:4]
            batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
            (model(**batch).loss / 2).backward()
        control = handler.on_pre_optimizer_step(None, state, control)
        opt.step()
        control = handler.on_optimizer_step(None, state, control)
        sched.step()
        opt.zero_grad()
        logs = {}
        handler.on_log(None, state, control, logs=logs)
        assert logs["safestep_scale"] == cb.history[-1].scale
    handler.on_train_end(None, state, control)
    _check_history(cb.history)
    assert all(math.isfinite(p.detach().abs().max().item()) for p in model.parameters())


def test_trainer_callback_binds_on_lr_spike(tmp_path):
    """The same through transformers.Trainer.train (needs accelerate, which Trainer requires)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (not in the test extra)")
    from transformers import Trainer, TrainingArguments

    from softcert.analysis.callbacks import SafeStepCallback

    model = _tiny_bert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1000.0 if s >= 3 else 1.0)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                             logging_strategy="steps", logging_steps=1, disable_tqdm=True, use_cpu=True,
                             dataloader_num_workers=0, max_grad_norm=0.0)
    cb = SafeStepCallback()
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(), optimizers=(opt, sched), callbacks=[cb])
    trainer.train()
    _check_history(cb.history)
    # the metrics reach the Trainer's own log (issue 32: they used to reach only later callbacks)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 6 and all("safestep_scale" in e and "safestep_ratio" in e for e in logged)
    assert [e["safestep_scale"] for e in logged] == [h.scale for h in cb.history]


def test_callbacks_module_imports_no_framework():
    code = ("import sys, softcert.analysis, softcert.analysis.callbacks, softcert.analysis.safestep; "
            "bad = [m for m in ('transformers', 'pytorch_lightning', 'lightning') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_callback_options_validated():
    from softcert.analysis.callbacks import SafeStepCallback

    with pytest.raises(ValueError, match="target_ratio"):
        SafeStepCallback(target_ratio=-1.0)
    with pytest.raises(ValueError, match="reuse_steps"):
        SafeStepCallback(reuse_steps=-2)
    with pytest.raises(AttributeError):
        import softcert.analysis.callbacks as cbm

        cbm.NoSuchCallback  # noqa: B018
