"""Factories for `python -m parity account --module examples.models:NAME`: each returns
(model, example_batch) or (model, example_batch, loss_fn) (docs/your-trainer.md). Nothing is
downloaded: transformers' GPT-2 is built from a small config.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def tiny_gpt2(batch_shape: tuple[int, ...] = (2, 8), attention: str = "eager",
              seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """transformers' GPT2LMHeadModel, 2 layers of width 64, 4 heads, V 128, 32 positions,
    dropout 0; the batch: token ids and labels (B, T) (the model shifts the labels)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    B, T = batch_shape
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0, use_cache=False,
                        attn_implementation=attention)
    torch.manual_seed(seed)  # transformers initializes from the global generator
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (B, T), generator=g)
    return model, {"input_ids": ids, "labels": ids}


def tiny_gpt2_sdpa(batch_shape: tuple[int, ...] = (2, 8)) -> tuple[nn.Module, dict]:
    """tiny_gpt2 with transformers' default attention (torch's SDPA kernel)."""
    return tiny_gpt2(batch_shape, attention="sdpa")


class ConvNet(nn.Module):
    """Conv2d(3 -> 8, 3x3) -> BatchNorm2d -> ReLU -> flatten -> Linear(8 H W -> 10)."""

    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8 * size * size, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu(self.bn(self.conv(x))).flatten(1))  # (N, 10)


def convnet(batch_shape: tuple[int, ...] = (4, 8), seed: int = 0
            ) -> tuple[nn.Module, torch.Tensor, Any]:
    """ConvNet on N images of 3 x S x S (batch_shape (N, S)), cross-entropy on 10 classes."""
    N, S = batch_shape
    g = torch.Generator().manual_seed(seed)
    model = ConvNet(S)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    x = torch.randn(N, 3, S, S, generator=g)
    y = torch.randint(0, 10, (N,), generator=g)
    return model, x, lambda output, batch: nn.functional.cross_entropy(output, y)
