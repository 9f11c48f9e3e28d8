"""A tiny GPT-2 trained with the Hugging Face Trainer, written the way its examples are.

No download: the model is built from a config (2 layers, 64 wide) and the data are
generated token sequences (counting, modulo the vocabulary, from a random start and stride),
which a small model learns in a few hundred steps. Nothing here imports muster: on the
platform, `integrations: auto` has the trial's import hook give the Trainer muster's
callback (planned length, metrics, checkpoints, resume, stops from the Trainer's own state);
`--muster-callback` adds it by hand instead.

    python train.py --epochs 2
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 64
LENGTH = 32


class Counting(Dataset):
    """Sequences start, start+stride, ... (mod VOCAB): the next token is predictable."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (size, 1), generator=generator)
        stride = torch.randint(1, 4, (size, 1), generator=generator)
        self.tokens = (start + stride * torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--output-dir", default="out")
    parser.add_argument("--muster-callback", action="store_true",
                        help="add muster's callback by hand (muster.integrations.transformers)")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2)
    training = TrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs,
        per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=3e-3,
        logging_steps=10, eval_strategy="epoch", save_strategy="epoch", save_total_limit=2,
        report_to="none", use_cpu=True, seed=0, disable_tqdm=True)
    callbacks = []
    if args.muster_callback:
        from muster.integrations.transformers import MusterCallback

        callbacks.append(MusterCallback())
    trainer = Trainer(model=GPT2LMHeadModel(config), args=training,
                      train_dataset=Counting(1024, seed=1), eval_dataset=Counting(256, seed=2),
                      callbacks=callbacks)
    trainer.train()
    print(f"eval: {trainer.evaluate()}")


if __name__ == "__main__":
    main()
