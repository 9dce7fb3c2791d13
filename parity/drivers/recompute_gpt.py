"""Recomputation on the transformer in both trees: one forward + backward of a GPT under a
recompute spec (reference/recompute_gpt.py, torch_impl/recompute_gpt.py), and what tests,
checks and docs read from it: every parameter's gradient, the loss, where the dropout
stream ends, the bytes held between forward and backward.

Both trees start from the same weights (the reference's, copied: parity.drivers.gpt
make_pair); each draws its own dropout masks (numpy's generator, torch's default one seeded
inside fork_rng), which is why gradients are compared WITHIN a tree (recompute vs none) and
held bytes across trees (a mask's bytes do not depend on its values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.recompute_plans import split_recompute
from parity.drivers.gpt import make_pair, to_torch_tokens, tokens
from parity.drivers.recompute import tanh_chain_recomputes
from reference import amp as ramp
from reference import gpt as rgpt
from reference.recompute_gpt import set_recompute as ref_set_recompute
from torch_impl.format_spec import DTYPES as TORCH_DTYPES
from torch_impl.recompute_gpt import set_recompute as torch_set_recompute

SPECS = ("sqrt", "uniform:2", "optimal:1", "optimal:2", "selective", "optimal:2+selective",
         "uniform:2+selective")


@dataclass
class GPTRun:
    """One tree's forward + backward under a spec: loss, gradients (with "rng_after", the
    dropout stream's end state as bytes), and the bytes held after forward."""

    loss: np.ndarray
    grads: dict[str, np.ndarray]
    held_bytes: int


def ref_run(config: rgpt.GPTConfig, spec: str, dtype: type, batch: int, seq_len: int,
            seed: int, autocast: str | None = None) -> GPTRun:
    """The reference GPT (weights from `seed`) under `spec`; the forward under autocast to
    `autocast` ("float16" | "bfloat16") when given."""
    model, _ = make_pair(config, dtype, seed % 1000)
    ref_set_recompute(model, spec)
    idx, targets = tokens(config, batch, seq_len, seed)
    rng = np.random.default_rng(seed)  # dropout's stream, the same for every spec
    for m in model.modules():
        if m.rng is not None:
            m.rng = rng
    with ramp.autocast(autocast):
        _, loss = model.forward(idx, targets)
    held = model.held_bytes()
    model.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    grads["rng_after"] = np.frombuffer(repr(rng.bit_generator.state).encode(), np.uint8)
    return GPTRun(np.asarray(loss), grads, held)


def torch_run(config: rgpt.GPTConfig, spec: str, dtype: type, batch: int, seq_len: int,
              seed: int, device: str = "cpu", autocast: str | None = None) -> GPTRun:
    """The torch twin (the reference's weights) under `spec` on `device`, its dropout seeded
    from `seed` inside fork_rng; the held bytes are the distinct non-parameter storages an
    outer saved_tensors_hooks sees packed during forward."""
    _, model = make_pair(config, dtype, seed % 1000, device)
    torch_set_recompute(model, spec)
    idx, targets = (to_torch_tokens(a, device) for a in tokens(config, batch, seq_len, seed))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.nbytes():
            storages[s.data_ptr()] = s.nbytes()
        return t

    device_type = torch.device(device).type
    with torch.random.fork_rng():  # the CPU and every CUDA generator
        torch.manual_seed(seed)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast(device_type, dtype=TORCH_DTYPES[autocast or "bfloat16"],
                               enabled=autocast is not None):
            _, loss = model(idx, targets)
        loss.backward()
        after = (torch.cuda.get_rng_state(torch.device(device)) if device_type == "cuda"
                 else torch.get_rng_state())
    grads = {k: p.grad.cpu().numpy() for k, p in model.named_parameters()}
    grads["rng_after"] = after.numpy().copy()
    return GPTRun(loss.detach().cpu().numpy(), grads, sum(storages.values()))


def recompute_rows(config: rgpt.GPTConfig, batch: int, seq_len: int,
                   specs: tuple[str, ...] = ("none", *SPECS)) -> list[dict]:
    """Per spec, exact and timing-free: the reference tape's held bytes (float32, dropout as
    configured), the torch hooks' held bytes, and the recomputed forward FLOPs: per block
    (the blocks' matmul FLOPs times the blocks recomputed) and selective (the cores')."""
    rows = []
    per_block, per_core = block_flops(config, batch, seq_len)
    for spec in specs:
        r = ref_run(config, spec, np.float32, batch, seq_len, 0)
        t = torch_run(config, spec, np.float32, batch, seq_len, 0)
        blocks, selective = split_recompute(spec)
        recomputed = tanh_chain_recomputes(blocks, config.n_layer)  # R, over blocks
        # a recomputed block recomputes its core inside it; selective adds one core forward
        # for every block's backward
        flops = recomputed * per_block + (config.n_layer * per_core if selective else 0)
        rows.append({"spec": spec, "held": r.held_bytes, "torch_held": t.held_bytes,
                     "extra_forward_flops": flops,
                     "forward_flops": config.n_layer * per_block})
    return rows


def block_flops(config: rgpt.GPTConfig, batch: int, seq_len: int) -> tuple[int, int]:
    """(one block's forward matmul FLOPs, its attention core's), from reference.gpt.matmuls."""
    rows = [r for r in rgpt.matmuls(config, batch, seq_len) if ".h.0." in r[0]]
    block = sum(2 * b * m * n * k for _, _, b, m, n, k in rows)
    core = sum(2 * b * m * n * k for path, _, b, m, n, k in rows if path.endswith("core"))
    return block, core
