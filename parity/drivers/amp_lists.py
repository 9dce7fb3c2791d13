"""Holding reference.amp's op lists to the installed torch (claim amp.op_lists), and the
ops it leaves unlisted (reference.amp.UNLISTED: no Autocast kernel, output in the input's
dtype).

Two checks per listed op: the dispatcher has an Autocast kernel for it on that device type
(`torch._C._dispatch_has_kernel_for_dispatch_key`, which answers for AutocastCUDA on a
CPU-only build too), and, where the op can be called with plain tensors, its output dtype
under autocast is the list's promise (lp for lower_precision_fp with float32 inputs, float32
for fp32 with lp inputs). CUDA policies are called on a CUDA device only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from reference import amp as ramp

KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
ATEN = torch.ops.aten

# Ops whose arguments are structured (RNN layers, attention internals, CTC, the private
# convolution overloads, a deprecated op): checked by registration only.
REGISTRATION_ONLY = frozenset({
    "mkldnn_rnn_layer", "_native_multi_head_attention", "_convolution.deprecated",
    "_convolution", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "_scaled_dot_product_flash_attention", "ctc_loss.IntList", "ctc_loss.Tensor",
    "chain_matmul",  # deprecated: calling it warns
})


def _calls() -> dict[str, Callable[[Callable[..., torch.Tensor]], torch.Tensor]]:
    """op -> f(t) calling the op on tensors made by t(*shape) (floating, the caller's dtype)
    or t(*shape, integer=k) (int64 class indices below k)."""
    return {
        "conv1d": lambda t: F.conv1d(t(1, 2, 5), t(3, 2, 2)),
        "conv2d": lambda t: F.conv2d(t(1, 2, 5, 5), t(3, 2, 2, 2)),
        "conv3d": lambda t: F.conv3d(t(1, 2, 4, 4, 4), t(3, 2, 2, 2, 2)),
        "conv_tbc": lambda t: torch.conv_tbc(t(5, 1, 2), t(2, 2, 3), t(3), 0),
        "conv_transpose1d": lambda t: F.conv_transpose1d(t(1, 2, 5), t(2, 3, 2)),
        "conv_transpose2d.input": lambda t: F.conv_transpose2d(t(1, 2, 4, 4), t(2, 3, 2, 2)),
        "conv_transpose3d.input": lambda t: F.conv_transpose3d(t(1, 2, 3, 3, 3),
                                                               t(2, 3, 2, 2, 2)),
        "convolution": lambda t: torch.convolution(t(1, 2, 5), t(3, 2, 2), None, [1], [0], [1],
                                                   False, [0], 1),
        "prelu": lambda t: F.prelu(t(2, 3), t(3)),
        "bmm": lambda t: torch.bmm(t(2, 3, 4), t(2, 4, 5)),
        "mm": lambda t: torch.mm(t(3, 4), t(4, 5)),
        "mv": lambda t: torch.mv(t(3, 4), t(4)),
        "addmv": lambda t: torch.addmv(t(3), t(3, 4), t(4)),
        "addr": lambda t: torch.addr(t(3, 4), t(3), t(4)),
        "linalg_vecdot": lambda t: torch.linalg.vecdot(t(3, 4), t(3, 4)),
        "baddbmm": lambda t: torch.baddbmm(t(2, 3, 5), t(2, 3, 4), t(2, 4, 5)),
        "addmm": lambda t: torch.addmm(t(3, 5), t(3, 4), t(4, 5)),
        "_addmm_activation": lambda t: torch._addmm_activation(t(3, 5), t(3, 4), t(4, 5)),
        "addbmm": lambda t: torch.addbmm(t(3, 5), t(2, 3, 4), t(2, 4, 5)),
        "linear": lambda t: F.linear(t(3, 4), t(5, 4), t(5)),
        "matmul": lambda t: torch.matmul(t(3, 4), t(4, 5)),
        "einsum": lambda t: torch.einsum("ij,jk->ik", t(3, 4), t(4, 5)),
        "linalg_multi_dot": lambda t: torch.linalg.multi_dot([t(3, 4), t(4, 5)]),
        "lstm_cell": lambda t: torch.lstm_cell(t(2, 3), (t(2, 4), t(2, 4)), t(16, 3),
                                               t(16, 4))[0],
        "gru_cell": lambda t: torch.gru_cell(t(2, 3), t(2, 4), t(12, 3), t(12, 4)),
        "rnn_tanh_cell": lambda t: torch.rnn_tanh_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
        "rnn_relu_cell": lambda t: torch.rnn_relu_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
        "scaled_dot_product_attention": lambda t: F.scaled_dot_product_attention(
            t(1, 2, 3, 4), t(1, 2, 3, 4), t(1, 2, 3, 4)),
        "softmax.int": lambda t: torch.softmax(t(3, 4), -1),
        "log_softmax.int": lambda t: torch.log_softmax(t(3, 4), -1),
        "layer_norm": lambda t: F.layer_norm(t(3, 4), (4,)),
        "native_layer_norm": lambda t: torch.native_layer_norm(t(3, 4), [4], None, None,
                                                               1e-5)[0],
        "mse_loss": lambda t: ATEN.mse_loss(t(3, 4), t(3, 4)),
        "cosine_embedding_loss": lambda t: ATEN.cosine_embedding_loss(t(3, 4), t(3, 4),
                                                                      t(3).sign()),
        "nll_loss": lambda t: ATEN.nll_loss(t(3, 4), t(3, integer=4)),
        "nll_loss2d": lambda t: ATEN.nll_loss2d(t(2, 4, 3, 3), t(2, 3, 3, integer=4)),
        "hinge_embedding_loss": lambda t: ATEN.hinge_embedding_loss(t(3, 4), t(3, 4).sign()),
        "poisson_nll_loss": lambda t: ATEN.poisson_nll_loss(t(3), t(3).abs(), True, False,
                                                            1e-8, 1),
        "smooth_l1_loss": lambda t: ATEN.smooth_l1_loss(t(3, 4), t(3, 4)),
        "cross_entropy_loss": lambda t: ATEN.cross_entropy_loss(t(3, 4), t(3, integer=4)),
        "l1_loss": lambda t: ATEN.l1_loss(t(3, 4), t(3, 4)),
        "huber_loss": lambda t: ATEN.huber_loss(t(3, 4), t(3, 4)),
        "margin_ranking_loss": lambda t: ATEN.margin_ranking_loss(t(3), t(3), t(3).sign()),
        "soft_margin_loss": lambda t: ATEN.soft_margin_loss(t(3, 4), t(3, 4).sign()),
        "triplet_margin_loss": lambda t: ATEN.triplet_margin_loss(t(3, 4), t(3, 4), t(3, 4)),
        "multi_margin_loss": lambda t: ATEN.multi_margin_loss(t(3, 4), t(3, integer=4)),
        "kl_div": lambda t: ATEN.kl_div(t(3, 4), t(3, 4)),
        "multilabel_margin_loss": lambda t: ATEN.multilabel_margin_loss(
            t(3, 4), torch.tensor([[1, -1, 0, 0]] * 3, device=t(1).device)),
        "binary_cross_entropy_with_logits": lambda t: ATEN.binary_cross_entropy_with_logits(
            t(3, 4), t(3, 4).sigmoid()),
    }


def _unlisted_calls() -> dict[str, Callable[[Callable[..., torch.Tensor]], torch.Tensor]]:
    """The ops of reference.amp.UNLISTED, called as _calls' are."""
    return {
        "embedding": lambda t: F.embedding(t(3, integer=5), t(5, 4)),
        "gelu": lambda t: F.gelu(t(3, 4), approximate="tanh"),
        "masked_fill.Scalar": lambda t: t(3, 4).masked_fill(t(3, 4) > 0, float("-inf")),
        "dropout": lambda t: F.dropout(t(3, 4), 0.5, training=True),
        "native_dropout": lambda t: torch.native_dropout(t(3, 4), 0.5, True)[0],
        "mul.Tensor": lambda t: t(3, 4) * t(3, 4),
        "mul.Scalar": lambda t: t(3, 4) * 0.5,
        "add.Tensor": lambda t: t(3, 4) + t(3, 4),
        "_softmax": lambda t: torch._softmax(t(3, 4), -1, False),
        "_log_softmax": lambda t: torch._log_softmax(t(3, 4), -1, False),
    }


def unlisted_dtype(op: str, in_dtype: torch.dtype, lp: torch.dtype, device: str) -> torch.dtype:
    """The output dtype of an UNLISTED op under autocast(device, lp) on `in_dtype` inputs."""
    gen = torch.Generator().manual_seed(0)

    def t(*shape: int, integer: int = 0) -> torch.Tensor:
        if integer:
            return torch.randint(0, integer, shape, generator=gen).to(device)
        return torch.randn(shape, generator=gen).to(device, in_dtype)

    with torch.autocast(torch.device(device).type, dtype=lp):
        return _unlisted_calls()[op](t).dtype


def registered(op: str, device_type: str) -> bool:
    """Whether the installed torch registers an Autocast kernel for aten `op` (name.overload)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", KEYS[device_type]))


def call_dtype(op: str, policy: str, lp: torch.dtype, device: str) -> torch.dtype:
    """The output dtype of `op` under autocast(device, lp), its floating inputs float32 for
    a lower_precision_fp op and lp for an fp32 one."""
    gen = torch.Generator().manual_seed(0)
    in_dtype = torch.float32 if policy == "lower_precision_fp" else lp

    def t(*shape: int, integer: int = 0) -> torch.Tensor:
        if integer:
            return torch.randint(0, integer, shape, generator=gen).to(device)
        return torch.randn(shape, generator=gen).to(device, in_dtype)

    with torch.autocast(torch.device(device).type, dtype=lp):
        return _calls()[op](t).dtype


def mismatches(device: str = "cpu") -> tuple[list[str], int]:
    """(what differs from the lists, how many facts were checked) on this device: the
    registration of every listed op on both device types, and the output dtype of every
    callable op listed for this device's type, in bfloat16 and float16."""
    found, checked = [], 0
    device_type = torch.device(device).type
    for dev_type, lists in ramp.LISTS.items():
        listed = {op for ops in lists.values() for op in ops}
        others = {op for d, ls in ramp.LISTS.items() if d != dev_type for ops in ls.values()
                  for op in ops} - listed
        for op in sorted(listed):
            checked += 1
            if not registered(op, dev_type):
                found.append(f"{op}: listed for {dev_type} but no {KEYS[dev_type]} kernel")
        for op in sorted(others):
            checked += 1
            if registered(op, dev_type):
                found.append(f"{op}: a {KEYS[dev_type]} kernel, but not in the {dev_type} lists")
        for op in ramp.UNLISTED:
            checked += 1
            if registered(op, dev_type):
                found.append(f"{op}: in UNLISTED but a {KEYS[dev_type]} kernel is registered")
        if dev_type != device_type:
            continue
        for op in ramp.UNLISTED:  # no cast: the output keeps the input's dtype
            for lp in (torch.bfloat16, torch.float16):
                for in_dtype in (torch.float32, lp):
                    checked += 1
                    got = unlisted_dtype(op, in_dtype, lp, device)
                    if got != in_dtype:
                        found.append(f"{op} (unlisted) on {in_dtype} under {lp} autocast on "
                                     f"{dev_type}: output {got}")
        for policy, ops in lists.items():
            want = None if policy == "fp32" else "lp"
            for op in ops:
                if op in REGISTRATION_ONLY:
                    continue
                for lp in (torch.bfloat16, torch.float16):
                    checked += 1
                    got = call_dtype(op, policy, lp, device)
                    if got != (lp if want == "lp" else torch.float32):
                        found.append(f"{op} ({policy}) under {lp} autocast on {dev_type}: "
                                     f"output {got}")
    return found, checked
