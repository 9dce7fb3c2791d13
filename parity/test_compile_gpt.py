"""torch.compile on the compact transformer (claims compile.gpt_*): the compiled forward,
loss and backward held to eager and to the reference within the probe bound
(NOTE [ Probable bounds by probes ]), plausible faults in the compiled model caught by it,
and the recompiles over batch and sequence counted by torch's counters.

Every Inductor compile of the transformer costs tens of seconds on 2 cores, so the compiled
cases are marked slow; the default run checks the bound's own model against eager (no
compile) on a one-block transformer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.claims.compile_gpt_bounds import probe_bounds
from parity.compare import assert_claim, measure
from parity.drivers import compile as dc
from parity.drivers import compile_gpt as cg
from parity.drivers import gpt as dg
from parity.tolerances import claim
from torch_impl import compile as tc
from torch_impl import gpt as tgpt

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module"),
]

CPU_ONLY = "the compile bounds rest on the nn claims' CPU kernels (parity/claims/nn.py)"
TINY = cg.GptCase(replace(cg.GPT_SMALL.config, n_layer=1), batch=2, seq_len=8, seed=3)


@pytest.fixture(scope="module", autouse=True)
def inductor_cache() -> Iterator[None]:
    """Inductor's caches fresh for this module (parity/test_compile.py's fixture)."""
    with dc.fresh_inductor_cache():
        yield


def _assert_within(n: cg.GptNumerics, cid: str, other: cg.Results, context: str) -> None:
    assert n.compiled_backward, f"{context}: the backward did not run compiled code"
    for key in cg.claimed(other):
        assert_claim(cid, actual=n.compiled[key], expected=other[key], context=f"{context} {key}",
                     scale=n.bound[key])
    if cg.TORCH < cg.WTE_GRAD_RIGHT:  # NOTE [ torch 2.6's compiled token-embedding gradient ]
        wrong = measure(claim(cid), n.compiled[cg.WTE], other[cg.WTE], scale=n.bound[cg.WTE])
        assert wrong > 1, f"{context}: torch {torch.__version__} computes {cg.WTE}'s gradient " \
                          f"right ({wrong:.3g} of the bound): move WTE_GRAD_RIGHT down"


def test_the_probe_bound_models_the_transformer_eager_runs(device: str) -> None:
    """The probe bound's own float64 model of the transformer (no compile) against torch's
    eager float32 run: every logit, the loss and every gradient within the bound (float32
    rounds on one side only), and not blind: the worst entry uses over 1/100 of it. A wrongly
    wired model (a block skipped, a scale forgotten) is off by orders of magnitude more."""
    if device != "cpu":
        pytest.skip(CPU_ONLY)
    config = TINY.config
    _, model = dg.make_pair(config, np.float32, TINY.seed)
    idx, targets = dg.tokens(config, TINY.batch, TINY.seq_len, TINY.seed)
    eager = cg.run(model, idx, targets)
    bound = probe_bounds(cg.state_of(model), config, idx, targets, seed=TINY.seed)
    c = claim("compile.gpt_eager")
    worst = max(measure(c, eager[k], bound.plain[k].astype(np.float32), scale=bound.scale[k])
                for k in eager)
    assert 1e-2 < worst <= 1.0, f"eager vs the probe model: {worst:.3g} of the bound"


@pytest.mark.slow
@pytest.mark.report
def test_compiled_gpt_matches_eager_and_reference_within_the_probe_bound(device: str) -> None:
    """Logits, loss and every gradient of the Inductor-compiled transformer within 6 sigma
    of the probe-propagated roundings, against eager and against the reference."""
    if device != "cpu":
        pytest.skip(CPU_ONLY)
    torch._dynamo.reset()
    n = cg.numerics(cg.GPT_COMPILED)
    assert n.reference is not None
    _assert_within(n, "compile.gpt_eager", n.eager, "eager")
    _assert_within(n, "compile.gpt_reference", n.reference, "reference")
    differ = sum(int((n.compiled[k] != n.eager[k]).sum()) for k in n.eager)
    assert differ > 0, "compiled and eager agree bit for bit: the bound was never exercised"


@pytest.mark.slow
@pytest.mark.report
def test_compiled_gpt_under_bf16_autocast_matches_eager_within_its_probe_bound(
        device: str) -> None:
    """Under bfloat16 autocast: bfloat16 logits, float32 loss and gradients within the probe
    bound with every autocast rounding kicked one bfloat16 ulp."""
    if device != "cpu":
        pytest.skip(CPU_ONLY)
    torch._dynamo.reset()
    n = cg.numerics(cg.GPT_COMPILED, "bf16")
    assert n.compiled["output"].dtype.itemsize == 2, "the logits are not bfloat16: no autocast"
    _assert_within(n, "compile.gpt_bf16", n.eager, "bf16")


def _exact_gelu(model: tgpt.GPT) -> None:
    """The classic mismatch: block 1's GELU exact (erf) where GPT-2's is the tanh form."""
    model.transformer.h[1].mlp.gelu = torch.nn.GELU()


def _float16_leak(model: tgpt.GPT) -> None:
    """A float16 rounding leaked after block 1's attention projection."""
    model.transformer.h[1].attn.c_proj.register_forward_hook(
        lambda mod, args, out: out.half().float())


def _layer_norm_eps(model: tgpt.GPT) -> None:
    """Block 2's second LayerNorm with eps 1e-6 instead of 1e-5."""
    model.transformer.h[2].ln_2.eps = 1e-6


def _scale_dropped(model: tgpt.GPT) -> None:
    """Block 3's attention scores without the 1/sqrt(head size) scale."""
    core = model.transformer.h[3].attn.core

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.size(-2)
        future = torch.ones(1, 1, T, T, dtype=torch.bool, device=q.device).triu(1)
        s = (q @ k.transpose(-2, -1)).masked_fill(future, -math.inf)
        return F.softmax(s, dim=-1) @ v

    core.forward = forward


@pytest.mark.slow
@pytest.mark.parametrize("fault", [_exact_gelu, _float16_leak, _layer_norm_eps, _scale_dropped],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_compiled_gpt_with_a_plausible_fault_fails_compile_gpt_eager(fault, device: str
                                                                       ) -> None:
    """The compiled side's model carries one fault (captured with backend aot_eager: the
    capture and the compiled backward without Inductor's code generation); the probe bound
    of compile.gpt_eager rejects it."""
    if device != "cpu":
        pytest.skip(CPU_ONLY)
    torch._dynamo.reset()
    n = cg.numerics(cg.GPT_SMALL, backend="aot_eager", fault=fault)
    c = claim("compile.gpt_eager")
    seen = max(measure(c, n.compiled[k], n.eager[k], scale=n.bound[k]) for k in n.eager)
    assert seen > 1, f"{fault.__name__}: compile.gpt_eager holds ({seen:.3g} of its bound)"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["forward", "module"])
def test_the_gpt_compiles_as_one_graph_with_its_token_check_inside(how: str, device: str
                                                                   ) -> None:
    """NOTE [ The token check compiles ]: torch.compile(model.forward, fullgraph=True) and
    model.compile(fullgraph=True) capture the forward as it is (backend "eager": Dynamo's
    capture run with eager kernels) as ONE graph, whose logits and loss are bit-identical to
    eager's, over a short sequence and a full block (dynamic=True); a token out of range
    then fails the graph's assertion with check_tokens' words, where eager raises the
    ValueError that also names the range it got; a wrong shape is refused while capturing."""
    from torch._dynamo.utils import counters

    model = tgpt.GPT(TINY.config, generator=torch.Generator().manual_seed(0), device=device)
    eager_model = tgpt.GPT(TINY.config, generator=torch.Generator().manual_seed(0),
                           device=device)
    torch._dynamo.reset()
    counters.clear()
    if how == "forward":
        compiled = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=True)
    else:
        model.compile(backend="eager", fullgraph=True, dynamic=True)
        compiled = model
    for T in (5, TINY.config.block_size):
        idx, targets = (dg.to_torch_tokens(t, device) for t in dg.tokens(TINY.config, 2, T, 0))
        got, want = compiled(idx, targets), eager_model(idx, targets)
        for name, a, b in zip(("logits", "loss"), got, want, strict=True):
            assert_claim("compile.breaks", actual=a, expected=b, context=f"{how}, T={T}, {name}")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    vocab = TINY.config.vocab_size
    for bad in (vocab, -1):
        tokens = torch.full((2, 4), bad, dtype=torch.int64, device=device)
        with pytest.raises(RuntimeError, match=rf"^GPT: idx token ids must lie in \[0, "
                                               rf"vocab_size={vocab}\)$"):
            compiled(tokens)
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, vocab_size={vocab}"
                                             rf"\), got \[{bad}, {bad}\]"):
            eager_model(tokens)
    # a wrong shape raises while capturing: fullgraph refuses the frame at check_tokens, and
    # without fullgraph the frame falls back to eager, which raises the ValueError itself
    too_long = torch.zeros((2, TINY.config.block_size + 1), dtype=torch.int64, device=device)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="check_tokens"):
        compiled(too_long)
    with pytest.raises(ValueError, match=r"must have shape \(B, T\)"):
        torch.compile(eager_model.forward, backend="eager")(too_long)


@pytest.mark.slow
def test_the_inductor_compiled_gpt_rejects_a_token_out_of_range(device: str) -> None:
    """Under Inductor the range assertion survives code generation from torch 2.11 (NOTE
    [ The token check compiles ]); before, the generated embedding's bounds check fires."""
    model = tgpt.GPT(TINY.config, generator=torch.Generator().manual_seed(0), device=device)
    torch._dynamo.reset()
    tc.compile_gpt_forward(model)
    idx, targets = (dg.to_torch_tokens(t, device) for t in dg.tokens(TINY.config, 2, 8, 0))
    model(idx, targets)[1].backward()
    bad = torch.full((2, 8), TINY.config.vocab_size, dtype=torch.int64, device=device)
    words = "token ids must lie in" if cg.TORCH >= tc.TOKEN_ASSERT_KEPT else "out of bounds"
    with pytest.raises(RuntimeError, match=words):
        model(bad, targets)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize("mode", cg.MODES)
def test_gpt_recompiles_over_batch_and_sequence_follow_the_guards(mode: str) -> None:
    """Graphs over GPT_SHAPES: 4 static, 3 automatic dynamic, 1 marked or dynamic=True; every
    failed guard a size mismatch of idx."""
    r = cg.count_shape_recompiles(mode)
    assert_claim("compile.gpt_recompiles", actual=torch.tensor([r.graphs]),
                 expected=torch.tensor([cg.expected_graphs(mode)]), context=mode)
    assert all("size mismatch" in line and "'idx'" in line.replace("L['idx']", "'idx'")
               for line in r.failed_guards), r.failed_guards
    assert (len(r.failed_guards) > 0) == (r.graphs > 1), r.failed_guards


def test_a_full_block_after_a_short_one_compiles_once_when_dynamic() -> None:
    """NOTE [ The mask is built for T ]: with dynamic=True, or mark_dynamic on batch and
    sequence, (4, 5) then a full block (4, block_size) compile one graph, no guard failed."""
    for mode in ("dynamic", "mark_dynamic"):
        full = cg.count_full_block(mode)
        assert not isinstance(full, str), f"{mode}: {full}"
        assert_claim("compile.gpt_recompiles",
                     actual=torch.tensor([full.graphs, len(full.failed_guards)]),
                     expected=torch.tensor([1, 0]),
                     context=f"{mode}, full block: {full.failed_guards}")
