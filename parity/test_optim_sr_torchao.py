"""reference.optim_sr against torchao 0.18.0 on CPU (claims optim.sr_bf16_torchao,
optim.sr_bf16_torchao_nan, optim.adamw_sr_torchao, optim.adamw_sr_torchao_moments):
`_fp32_to_bf16_sr` and `_AdamW(bf16_stochastic_round=True)`, fed the draws torchao draws by
seeding torch's global generator and replaying its randint. Skipped, saying so, without
torchao (the oracles extra: pip install -e .[oracles]).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from hypothesis import given

from parity.compare import assert_claim
from parity.drivers.optim import bf16_from_torch, bf16_to_torch
from parity.extras import import_extra
from parity.strategies import examples, sr_bf16_inputs, sr_edge_bits
from reference import optim_sr as ref
from reference.module import Parameter

torchao = import_extra("torchao", "the bf16 stochastic-rounding oracle")
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum notices
from torch._inductor import config as inductor_config  # noqa: E402
from torchao.optim import _AdamW  # noqa: E402
from torchao.optim.quant_utils import _fp32_to_bf16_sr  # noqa: E402

SEED = 1234
# torchao compiles its step (torch.compile, inductor), whose import path still touches the
# deprecated torch.jit.script_method and logs its cache's serialization skips (torch's own
# warnings, as parity/test_compile.py ignores them; only these messages)
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module"),
]


def _cpu_only(device: str) -> None:
    if device != "cpu":
        pytest.skip("torchao's compiled step and its draws are held on the CPU")


def _torchao_and_draws(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torchao's result on x, and the draws it made, replayed: the generator is seeded, torchao
    draws inside its call, then re-seeded and drawn the same; the two leave it in one state."""
    torch.manual_seed(SEED)
    y = _fp32_to_bf16_sr(torch.from_numpy(x.copy()))
    after_torchao = torch.get_rng_state()
    torch.manual_seed(SEED)
    r = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32)
    assert torch.equal(torch.get_rng_state(), after_torchao), "the replay drew what torchao drew"
    return bf16_from_torch(y), r.numpy()


def _check(bits: np.ndarray) -> None:
    x = bits.view(np.float32)
    theirs, draws = _torchao_and_draws(x)
    number = ~np.isnan(x)
    ours = ref.round_bf16_stochastic(x, draws)
    assert_claim("optim.sr_bf16_torchao", actual=theirs.view(np.uint16)[number],
                 expected=ours.view(np.uint16)[number])
    variant = ref.round_bf16_stochastic(x, draws, variant="torchao")
    assert_claim("optim.sr_bf16_torchao_nan", actual=theirs.astype(np.float32),
                 expected=variant.astype(np.float32))


def test_sr_bf16_matches_torchao_on_every_edge(device: str) -> None:
    """Every edge of SR_EDGES, repeated so that each meets many draws."""
    _cpu_only(device)
    bits = np.tile(sr_edge_bits(), 512)
    _check(bits)
    x = bits.view(np.float32)
    theirs, _ = _torchao_and_draws(x)
    codes = theirs.view(np.uint16)
    assert ((codes != bits >> 16) & ~np.isnan(x)).any(), "some edge was rounded up"
    assert (codes == 0x7F80)[bits == 0x7F7FFFFF].any(), "the largest finite reached inf"


@examples(100)
@given(sr_bf16_inputs())
def test_sr_bf16_matches_torchao_for_any_bits(device: str, bits: np.ndarray) -> None:
    """Any float32 bits."""
    _cpu_only(device)
    _check(bits)


def _run_torchao(p0: np.ndarray, grads: list[np.ndarray], kw: dict, fallback_random: bool
                 ) -> tuple[torch.nn.Parameter, dict]:
    """torchao's _AdamW from p0 over the gradients, the global generator seeded at SEED."""
    torch._dynamo.reset()  # inductor's config is read when a graph compiles
    try:
        with inductor_config.patch(fallback_random=fallback_random):
            p = torch.nn.Parameter(bf16_to_torch(p0))
            opt = _AdamW([p], bf16_stochastic_round=True, **kw)
            torch.manual_seed(SEED)
            for g in grads:
                p.grad = bf16_to_torch(g)
                opt.step()
    finally:
        torch._dynamo.reset()
    return p, opt.state[p]


def _run_reference(p0: np.ndarray, grads: list[np.ndarray], kw: dict
                   ) -> tuple[Parameter, dict]:
    """AdamWSR on the draws torchao's steps make with torch's randint, one per step."""
    torch.manual_seed(SEED)
    draws = [torch.randint(0, 1 << 16, p0.shape, dtype=torch.int32).numpy() for _ in grads]
    p = Parameter(p0.copy())
    opt = ref.AdamWSR([p], **kw)
    for g, r in zip(grads, draws, strict=True):
        p.grad = g.copy()
        opt.step([r])
    return p, opt.state[p]


def _case() -> tuple[np.ndarray, list[np.ndarray], dict]:
    rng = np.random.default_rng(7)
    zero = np.zeros(259, np.int32)
    p0 = ref.round_bf16_stochastic(rng.standard_normal(259).astype(np.float32), zero)
    grads = [ref.round_bf16_stochastic((rng.standard_normal(259) * 10.0 ** (k - 3))
                                       .astype(np.float32), zero) for k in range(5)]
    kw = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": True}
    return p0, grads, kw


def test_adamw_sr_matches_torchao_adamw_bitwise(device: str) -> None:
    """Five steps with weight decay and amsgrad: parameters and every state entry equal
    torchao's, its draws replayed (inductor's fallback_random)."""
    _cpu_only(device)
    p0, grads, kw = _case()
    theirs_p, theirs = _run_torchao(p0, grads, kw, fallback_random=True)
    ours_p, ours = _run_reference(p0, grads, kw)
    assert set(theirs) == set(ours)
    assert_claim("optim.adamw_sr_torchao", actual=theirs["step"].numpy(), expected=ours["step"])
    for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert theirs[name].dtype == torch.bfloat16, "torchao keeps the moments in p's dtype"
        assert_claim("optim.adamw_sr_torchao", actual=bf16_from_torch(theirs[name]).view(np.uint16),
                     expected=ours[name].view(np.uint16), context=name)
    assert_claim("optim.adamw_sr_torchao", actual=bf16_from_torch(theirs_p).view(np.uint16),
                 expected=ours_p.data.view(np.uint16))
    assert (ours_p.data.view(np.uint16) != p0.view(np.uint16)).any(), "the steps moved p"


def test_adamw_sr_moments_match_torchao_under_inductor_random(device: str) -> None:
    """With inductor's own random numbers the moments still equal, the parameters do not."""
    _cpu_only(device)
    p0, grads, kw = _case()
    theirs_p, theirs = _run_torchao(p0, grads, kw, fallback_random=False)
    ours_p, ours = _run_reference(p0, grads, kw)
    for name in ("exp_avg", "exp_avg_sq"):
        assert_claim("optim.adamw_sr_torchao_moments",
                     actual=bf16_from_torch(theirs[name]).view(np.uint16),
                     expected=ours[name].view(np.uint16), context=name)
    assert not np.array_equal(bf16_from_torch(theirs_p).view(np.uint16),
                              ours_p.data.view(np.uint16)), "inductor's draws were other draws"
