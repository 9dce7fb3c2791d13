"""The small gaps a user met beside resume-check in the your-trainer tools, each held through
the real command line (`main(argv)`, as `python -m parity` runs it): `account --module`
on nanoGPT's own model (its LayerNorm class, its SDPA attention), imported from the current
folder; `audit --json` whose stdout is one JSON object and nothing else.
HostReads (a bool of values counted by default; ScalerGuard's wrappers looked through) has
no command: tests/test_host_reads.py holds it through its API.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parity.lab.cli import EXIT_FAILED, EXIT_OK, main
from reference.flops import transformer_flops

# nanoGPT's model.py, as it is (its own LayerNorm with an optional bias, the flash path:
# F.scaled_dot_product_attention with is_causal=True, a tied head), cut to what a step runs
NANOGPT = '''
import math
import torch
import torch.nn as nn
from torch.nn import functional as F

class LayerNorm(nn.Module):
    """ LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False """
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.0), nn.Dropout(0.0)
        self.n_head, self.n_embd = n_head, n_embd
    def forward(self, x):
        B, T, C = x.size() # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)
    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=True)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = LayerNorm(n_embd, bias=True)
        self.mlp = MLP(n_embd)
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte = nn.Embedding(vocab_size, n_embd),
            wpe = nn.Embedding(block_size, n_embd),
            drop = nn.Dropout(0.0),
            h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f = LayerNorm(n_embd, bias=True),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device) # shape (t)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

def make(batch_shape=(2, 16)):
    B, T = batch_shape
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (B, T))
    return GPT(64, 16, 2, 4, 32), (idx, torch.roll(idx, -1, 1))
'''


def test_nanogpts_own_model_is_gpt2_shaped_and_its_sdpa_core_is_a_named_term(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`account --module nanogpt_model:make --json` where the file is: read as GPT-2-shaped
    (its LayerNorm class is rule 2's LayerNorm), the FLOPs line the closed form less the
    term for the SDPA core FlopCounterMode does not count on the CPU, 12 L B T^2 h = 393,216
    (L 2, B 2, T 16, h 32), and no residual; before, it was not recognized and the core's
    FLOPs went missing behind 'unexplained gaps 0'."""
    (tmp_path / "nanogpt_model.py").write_text(NANOGPT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command appends the folder
    try:
        status = main(["account", "--module", "nanogpt_model:make", "--batch-shape", "2,16",
                       "--json"])
    finally:
        sys.modules.pop("nanogpt_model", None)
    report = json.loads(capsys.readouterr().out)
    assert status == EXIT_OK and report["unexplained"] == 0
    assert report["not_gpt2"] is None, report["not_gpt2"]
    flops = {ln["quantity"]: ln for ln in report["gpt2"]}["flops"]
    L, B, T, h = 2, 2, 16, 32
    assert flops["formula"] == transformer_flops(n_layer=L, d_model=h, n_head=4, seq_len=T,
                                                 batch=B, vocab=64)
    core = -12 * L * B * T * T * h  # 3 passes x (Q K^T and P V: 2 x 2 B T^2 h) x L
    assert core == -393_216
    assert flops["terms"] == {"attention core not counted (SDPA kernel)": core}
    assert flops["formula"] == 5_505_024  # the closed form's total for this shape
    assert flops["measured"] == flops["formula"] - 393_216 and flops["residual"] == 0


def test_audit_json_is_one_json_object_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit FILE --json` on a nanoGPT-style file: json.loads takes stdout whole (the
    verdict line, once printed after the object, is inside it), exit 1 (no RNG state)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "model_args": {"n_layer": 1}, "iter_num": 1}, path)
    status = main(["audit", str(path), "--json"])
    out = capsys.readouterr().out
    report = json.loads(out)
    assert status == EXIT_FAILED and report["exact"] is False
    assert report["verdict"].startswith("exact resume impossible: torch CPU RNG")
