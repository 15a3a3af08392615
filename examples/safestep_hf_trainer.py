"""SafeStep in a Hugging Face Trainer: one callback, no change to the model or the loop.

    python examples/safestep_hf_trainer.py [--spike 1000] [--steps 60]

A tiny BERT classifier (built from a config: nothing is downloaded) learns a toy rule on
random token sequences (label = first token mod 3) with AdamW; from step 20 the learning rate
is multiplied by --spike. Run once plain and once with ``SafeStepCallback``, which scales each
update p by min(1, rho_a / ||p||), rho_a = pi / max_x (max_k a_k - min_k a_k), a = J_z p over
all gradient-accumulation micro-batches of the step; the logits are ``output.logits``.
transformers.Trainer needs `accelerate` installed (pip install 'transformers[torch]').
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from softcert.analysis.callbacks import SafeStepCallback

VOCAB, SEQ = 40, 8


def dataset(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
             "labels": ids[i, 0] % 3} for i in range(n)]


def run(safe: bool, spike: float, steps: int) -> float:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, num_labels=3)
    model = BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: spike if s >= 20 else 1.0)
    callbacks = [SafeStepCallback()] if safe else []
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=16,
                                 gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True, use_cpu=True)
        trainer = Trainer(model=model, args=args, train_dataset=dataset(512, 0), optimizers=(opt, sched),
                          callbacks=callbacks)
        trainer.train()
    if safe:
        hist = callbacks[0].history
        print(f"  SafeStep bound {sum(s.scale < 1 for s in hist)} of {len(hist)} steps")
    test = dataset(256, 1)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.stack([r["input_ids"] for r in test])).logits
    return (logits.argmax(1) == torch.stack([r["labels"] for r in test])).float().mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spike", type=float, default=1000.0)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    for safe in (False, True):
        acc = run(safe, args.spike, args.steps)
        print(f"{'SafeStep' if safe else 'plain'}: test accuracy {100 * acc:.1f} % (LR x{args.spike:g} from step 20)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
