"""Causal self-attention from torch ops. See reference/attention.py for the math and the tape.

Same classes, names and statement order as the reference. What PyTorch does differently or
hides: the explicit path is matmul, a multiplication by a Python float (a wrapped number that
saved_tensors_hooks never see: NOTE [ The scale is not on the tape ]), masked_fill and softmax,
so FlopCounterMode and the hooks see each op, and torch's matmul copies the strided q, k^T and
v into (B nh, T, d) batches. attention="sdpa" replaces the core's body by
F.scaled_dot_product_attention(is_causal=True), a fused kernel that keeps other tensors (on CPU
the flash kernel saves q, k, v, the output and a log-sum-exp, not the (T, T) probabilities);
its dropout draws differently again, so sdpa is compared with dropout off.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from common.gpt_config import GPTConfig


class AttentionCore(nn.Module):
    """y = dropout(softmax(masked_fill(q k^T / sqrt d, future, -inf))) v, per head."""

    def __init__(self, block_size: int, dropout: float, attention: str = "explicit") -> None:
        super().__init__()
        self.block_size = block_size
        self.attention = attention
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T, hs = q.size(-2), q.size(-1)  # time, head size
        if self.attention == "sdpa":
            p = self.attn_dropout.p if self.training else 0.0
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        # (1, 1, T, T), built for T: a slice of a (block, block) buffer would be guarded
        # T != block_size under torch.compile (NOTE [ The mask is built for T ])
        future = torch.ones(1, 1, T, T, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
        p = self.attn_dropout(F.softmax(s, dim=-1))
        return p @ v


class CausalSelfAttention(nn.Module):
    """c_attn (C -> 3C), heads split, the core, heads merged, c_proj (C -> C), dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        C = config.n_embd
        self.n_head = config.n_head
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)
        self.core = AttentionCore(config.block_size, config.dropout, config.attention)
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, time, channels
        nh = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C), views
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        y = self.core(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))
