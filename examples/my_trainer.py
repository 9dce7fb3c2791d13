"""A user's trainer, written the way many are: a character-level GPT with nanoGPT's shape
and loop (cut down to run in seconds on a CPU), float16 autocast with a GradScaler, AdamW,
gradient clipping, a checkpoint at the end. It holds four classic bugs; --fixed fixes all
four (each one is marked BUG in the code, beside its fix):

  1. clip before unscale: clip_grad_norm_ on the SCALED gradients clips at max_norm / scale
  2. a checkpoint without the GradScaler and the RNG state (nanoGPT's: model, optimizer,
     model_args, iter_num): a resume restarts the loss scale and draws other batches
  3. loss.item() inside every step: a host sync (on CUDA the CPU waits for every queued
     kernel before it can queue the next step's)
  4. a hand-written log-softmax, log(sum(exp(logits))): in float16 exp overflows past 11.09
     and the sum past 65504, so the loss turns inf, then NaN

    python examples/my_trainer.py [--fixed] [--steps 60] [--out out-my-trainer]

docs/your-trainer.md walks this file through each of the project's checks, and
tests/test_my_trainer_example.py holds them to finding each bug here and none with --fixed.
`make_trainer` / `make_fixed_trainer` build the loop as an object with state_dict(),
load_state_dict() and step(), which `python -m parity resume-check` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

# -----------------------------------------------------------------------------
# data: a tiny text, batches drawn at random positions (nanoGPT's get_batch)
text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. " * 30
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
block_size, batch_size = 16, 8
learning_rate, grad_clip, max_iters = 3e-2, 1.0, 60


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - block_size, (batch_size,))  # the global RNG
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


# -----------------------------------------------------------------------------
# the model
@dataclass
class GPTConfig:
    block_size: int = block_size
    vocab_size: int = len(chars)
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.1


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = nn.MultiheadAttention(config.n_embd, config.n_head,
                                          dropout=config.dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd),
                                 nn.Dropout(config.dropout))
        mask = torch.triu(torch.ones(config.block_size, config.block_size, dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)  # x: (batch, time, channels)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class LogSoftmaxNLL(nn.Module):
    """-log softmax(logits)[target], averaged: the textbook formula, written out."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # BUG 4 (without --fixed): log(sum(exp(logits))) in float16 overflows
        logp = logits - logits.exp().sum(-1, keepdim=True).log()
        return -logp.gather(-1, targets.unsqueeze(-1)).mean()


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, fixed: bool = False) -> None:
        super().__init__()
        self.config = config
        # fixed: torch's fused, stable loss, which autocast runs in float32
        self.criterion = nn.CrossEntropyLoss() if fixed else LogSoftmaxNLL()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
        B, T = idx.size()
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab), float16 under autocast
        loss = self.criterion(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss


# -----------------------------------------------------------------------------
# the loop, one iteration per step() call
class Trainer:
    def __init__(self, fixed: bool = False, seed: int = 1337) -> None:
        torch.manual_seed(seed)
        self.fixed = fixed
        self.model_args = asdict(GPTConfig())
        self.model = GPT(GPTConfig(**self.model_args), fixed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        self.iter_num = 0
        self.losses: list[float] = []
        self.loss_sum = torch.zeros(())

    def step(self, phase=lambda name: contextlib.nullcontext()) -> None:
        X, Y = get_batch()
        with phase("forward"), torch.autocast("cpu", dtype=torch.float16):
            _, loss = self.model(X, Y)
        with phase("backward"):
            self.scaler.scale(loss).backward()
        with phase("optimizer"):
            if self.fixed:
                self.scaler.unscale_(self.optimizer)
            # BUG 1 (without --fixed): the gradients are still multiplied by the scale here
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        if self.fixed:  # summed on the device, read at the log interval
            self.loss_sum += loss.detach().float()
        else:  # BUG 3: a host sync in every step
            self.losses.append(loss.item())
        self.iter_num += 1

    def state_dict(self) -> dict:
        checkpoint = {"model": self.model.state_dict(),
                      "optimizer": self.optimizer.state_dict(),
                      "model_args": self.model_args, "iter_num": self.iter_num}
        if self.fixed:  # BUG 2 (without --fixed): no scaler, no RNG state
            checkpoint["scaler"] = self.scaler.state_dict()
            checkpoint["rng_state"] = torch.get_rng_state()
        return checkpoint

    def load_state_dict(self, checkpoint: dict) -> None:
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.iter_num = checkpoint["iter_num"]
        if "scaler" in checkpoint:
            self.scaler.load_state_dict(checkpoint["scaler"])
        if "rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["rng_state"])


def make_trainer() -> Trainer:
    return Trainer(fixed=False)


def make_fixed_trainer() -> Trainer:
    return Trainer(fixed=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="all four bugs fixed")
    parser.add_argument("--steps", type=int, default=max_iters)
    parser.add_argument("--out", default="out-my-trainer")
    args = parser.parse_args()
    # a model this small: one thread. Its matmuls are 32 wide; split over threads, each op
    # waits for the slowest, and on a busy machine a step took 0.02 to 0.8 s instead of 0.02
    torch.set_num_threads(1)
    trainer = Trainer(fixed=args.fixed)
    for it in range(args.steps):
        trainer.step()
        if it % 10 == 0 or it == args.steps - 1:
            lossf = (trainer.losses[-1] if not args.fixed
                     else trainer.loss_sum.item() / trainer.iter_num)
            print(f"iter {it}: loss {lossf:.4f}, scale {trainer.scaler.get_scale():g}")
    os.makedirs(args.out, exist_ok=True)
    torch.save(trainer.state_dict(), os.path.join(args.out, "ckpt.pt"))
    print(f"saved {os.path.join(args.out, 'ckpt.pt')}")


if __name__ == "__main__":
    main()
