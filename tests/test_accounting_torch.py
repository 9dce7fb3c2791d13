"""torch_impl.accounting against documented PyTorch behaviour: what FlopCounterMode counts and
does not count, which GEMMs autograd runs, Adam's per-tensor step, the saved-tensor notion,
StepMeter's phases, and on CUDA the caching allocator's 512-byte blocks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from torch_impl import accounting as tacc


def _flops(fn: object) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()  # type: ignore[operator]
    return mode.get_total_flops()


@pytest.mark.parametrize("where", ["cpu", "meta"])
def test_flop_counter_counts_sdpa_as_zero_on_cpu_and_as_dense_bmm_on_meta(where: str) -> None:
    """On the CPU, scaled_dot_product_attention runs a flash kernel FlopCounterMode does not
    know: 0 FLOPs, forward and backward. On meta it takes the math path: the explicit
    attention's 4 B a s^2 d, dense, causal mask or not."""
    b, a, s, d = 2, 3, 16, 8
    q = torch.randn(b, a, s, d, device=where, requires_grad=True)
    dense = 4 * b * a * s * s * d
    explicit = _flops(lambda: (q @ q.transpose(-2, -1)).softmax(-1) @ q)
    assert explicit == dense
    out: list[torch.Tensor] = []
    sdpa = _flops(lambda: out.append(F.scaled_dot_product_attention(q, q, q, is_causal=True)))
    backward = _flops(lambda: out[0].sum().backward())
    assert (sdpa, backward) == ((0, 0) if where == "cpu" else (dense, 2 * dense))


def test_flop_counter_counts_2mnk_and_autograd_skips_dx_for_data(device: str) -> None:
    """addmm counts 2 N in out (the bias add is free); its backward is dW alone when the
    input does not require grad, dW + dx when it does."""
    layer = nn.Linear(5, 7, device=device)
    for needs_grad, factor in ((False, 1), (True, 2)):
        x = torch.randn(3, 5, device=device, requires_grad=needs_grad)
        y: list[torch.Tensor] = []
        assert _flops(lambda x=x, y=y: y.append(layer(x))) == 2 * 3 * 5 * 7
        assert _flops(lambda y=y: y[0].sum().backward()) == factor * 2 * 3 * 5 * 7


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adam_keeps_a_float32_step_per_parameter_tensor(optimizer: type, dtype: torch.dtype,
                                                        device: str) -> None:
    """state["step"] is a 0-dim float32 tensor per parameter tensor, whatever the
    parameters' dtype: 4 bytes x tensors, the term a per-parameter formula misses."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).to(device=device, dtype=dtype)
    opt = optimizer(model.parameters())
    model(torch.randn(5, 3, device=device, dtype=dtype)).sum().backward()
    opt.step()
    entries = tacc.optimizer_state_bytes(opt)
    assert entries["step"] == 4 * 4
    assert entries["exp_avg"] == entries["exp_avg_sq"] == tacc.parameter_bytes(model)
    state = tacc.state_bytes(model, opt)
    assert state["optimizer_step"] == 16 and state["total"] == sum(
        v for k, v in state.items() if k != "total")


def test_saved_bytes_exclude_parameters_and_count_a_shared_tensor_once() -> None:
    """Tanh's result is also the next Linear's mat1: one tensor; the second weight (mat2 =
    W^T) is a view of a parameter, excluded; the first input is the data, counted."""
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    with tacc.StepMeter(model) as meter:
        model(torch.randn(4, 5))
    assert [p.is_parameter for p in meter.packed] == [False, False, False, True]
    assert meter.held() == 4 * 5 * 4 + 4 * 7 * 4
    assert meter.held("loss") == 0


@pytest.mark.parametrize("early_stop", [True, False])
def test_step_meter_splits_the_recompute_out_of_backward(early_stop: bool) -> None:
    """checkpoint(Linear, GELU, Linear): the recompute re-runs the first Linear's GEMM, and
    the second's only without early stop (its addmm saves mat1 and mat2 before the kernel:
    the last saves of the segment, where early stop raises); backward is 2 x forward."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(4, 5, 8, requires_grad=True)
    first, second = 2 * 20 * 8 * 32, 2 * 20 * 32 * 8
    with set_checkpoint_early_stop(early_stop), tacc.StepMeter(block) as meter:
        y = checkpoint(block, x, use_reentrant=False)
        meter.backward_begins()
        y.sum().backward()
    assert meter.flops.as_dict() == {
        "forward": first + second, "backward": 2 * (first + second),
        "recompute": first + (0 if early_stop else second), "optimizer": 0,
        "total": 3 * (first + second) + first + (0 if early_stop else second)}
    assert meter.held() == x.numel() * 4  # the checkpoint keeps only its input


def test_step_meter_counts_the_optimizer_step_as_zero_flops() -> None:
    """FlopCounterMode counts no elementwise op: Adam's update is 0 FLOPs."""
    model = nn.Linear(6, 6)
    loss_fn = nn.MSELoss()
    opt = torch.optim.Adam(model.parameters())
    with tacc.StepMeter(model, loss_fn=loss_fn, optimizer=opt) as meter:
        loss_fn(model(torch.randn(3, 6)), torch.zeros(3, 6)).backward()
        opt.step()
    assert meter.flops.as_dict() == {"forward": 2 * 3 * 36, "backward": 2 * 3 * 36,
                                     "recompute": 0, "optimizer": 0, "total": 4 * 3 * 36}


def test_cuda_allocations_are_rounded_to_512_byte_blocks(cuda_device: str) -> None:
    """The caching allocator hands out multiples of 512 bytes: after an Adam step with
    gradients set by hand (no GEMM, so no cuBLAS workspace), memory_allocated grew by the
    rounded size of every parameter, gradient, exp_avg and exp_avg_sq; the step tensors
    live on the CPU (not capturable, not fused)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = nn.Sequential(nn.Linear(13, 7), nn.Linear(7, 3)).to(cuda_device)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    opt.step()
    torch.cuda.synchronize()
    tensors = [t for p in model.parameters() for t in (p, p.grad)]
    tensors += [v for s in opt.state.values() for v in s.values() if v.is_cuda]
    assert all(not s["step"].is_cuda for s in opt.state.values())
    expected = sum(tacc.cuda_allocated(t.numel() * t.element_size()) for t in tensors)
    assert torch.cuda.memory_allocated() - before == expected
    assert expected > sum(t.numel() * t.element_size() for t in tensors)  # the rounding term


def test_cuda_phases_hold_the_saved_bytes_and_each_phase_its_own_peak(cuda_device: str
                                                                      ) -> None:
    """StepMeter on CUDA reports each phase's allocated bytes; the forward's growth is at
    least what autograd saved that the forward allocated (the rest: rounding to 512 bytes,
    outputs, the cuBLAS workspace of the first GEMM). Plain SGD's step (no momentum, no weight
    decay: `param.add_(grad, alpha=-lr)`, foreach or not) allocates nothing, so the optimizer
    phase's peak is its start, to the byte; the backward held the saved tensors and the new
    gradients at once, so its peak is above that. A meter that does not reset the peak at each
    phase's start reports the backward's peak for the optimizer and fails (the scripted
    allocator in tests/test_cuda_meters.py proves the same on any machine)."""
    from parity.drivers.accounting import MLPCase, torch_step

    measured = torch_step(MLPCase(activation="gelu", dropout=0.1, optimizer="sgd"), cuda_device)
    cuda = measured["cuda"]
    assert set(cuda) == {"forward", "backward", "optimizer"}  # type: ignore[arg-type]
    grew = cuda["forward"]["end"] - cuda["forward"]["start"]  # type: ignore[index]
    held = measured["held"]
    data = 16 * 8 * 4 + 16 * 8  # the batch and its int64 targets, allocated before the step
    assert grew >= held["model"] + held["loss"] - data  # type: ignore[index]
    opt, back = cuda["optimizer"], cuda["backward"]  # type: ignore[index]
    assert opt["peak"] == opt["start"] == opt["end"], opt
    assert back["peak"] > opt["peak"], (back, opt)


def test_account_command_reconciles_the_mlp_with_every_gap_named(capsys: pytest.CaptureFixture
                                                                 ) -> None:
    """`account --model mlp --measure --json`: one JSON object; torch measures every
    predicted row exactly; the reference's gaps all carry their terms; exit 0."""
    import json

    from parity.lab.cli import main

    argv = ["account", "--model", "mlp", "--measure", "--json", "--precision", "fp16",
            "--recompute", "sqrt", "--dropout", "0.2", "--optimizer", "adam"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unexplained"] == 0 and out["totals"]["bytes_per_param"] == 16
    assert all(r["measured"]["torch"] == r["predicted"] for r in out["rows"])
    assert main(["account", "--model", "mlp", "--measure"]) == 0
    text = capsys.readouterr().out.strip().splitlines()
    assert "the reference computes the first dx" in "\n".join(text)
    assert text[-1].startswith("account: memory ") and text[-1].endswith("unexplained gaps 0")


def test_account_command_measures_the_transformer_with_no_gap(capsys: pytest.CaptureFixture
                                                              ) -> None:
    """`account --model gpt --measure --json` on a small transformer: every row torch
    measures equals its prediction, the reference's rows too, exit 0."""
    import json

    from parity.lab.cli import main

    argv = ["account", "--model", "gpt", "--measure", "--json", "--n-layer", "2",
            "--d-model", "8", "--n-head", "2", "--seq-len", "5", "--block-size", "6",
            "--vocab", "7", "--batch", "2", "--precision", "bf16", "--recompute",
            "full_early_stop"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["rows"]}
    assert out["unexplained"] == 0 and rows["activations: model"]["measured"]["torch"] > 0
    for r in out["rows"]:
        for tree in ("torch", "reference"):
            assert r["measured"][tree] in (None, r["predicted"]), (r, tree)
    assert rows["recompute"]["measured"]["torch"] == rows["recompute"]["predicted"] > 0


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "gpt", "--n-head", "7"], "divisors of d_model"),
    (["--model", "gpt", "--recompute", "selective"], "'full_early_stop'"),
    (["--model", "mlp", "--recompute", "full"], "optimal:S"),
    (["--model", "mlp", "--precision", "bf16_mixed"], "fp32, bf16, fp16"),
    (["--model", "mlp", "--sizes", "8,0,3"], "positive widths"),
    (["--model", "mlp", "--batch", "-2"], "below the minimum 1"),
    (["--model", "mlp", "--optimizer", "lion"], "'sgd_momentum'"),
    (["--model", "mlp", "--device", "tpu"], "cpu, cuda, cuda:N"),
    (["--model", "gpt", "--measure", "--no-bias"], "accepted for a measured step: bias"),
    (["--model", "gpt", "--measure"], "above --measure-limit"),
    (["--model", "gpt", "--seq-len", "8", "--block-size", "4"], "block_size >= seq_len"),
])
def test_account_command_bad_input_is_one_line_and_exit_2(argv: list[str], says: str,
                                                          capsys: pytest.CaptureFixture) -> None:
    from parity.lab.cli import main

    try:
        status = main(["account", *argv])
    except SystemExit as e:  # argparse's own errors
        status = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and says in err[0], err
