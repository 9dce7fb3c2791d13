"""torch_impl's transformer on its own: what only the torch tree runs (attention="sdpa"), and
causality on both attention paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.gpt_config import GPTConfig
from reference import gpt as rgpt
from torch_impl import gpt as tgpt


def test_the_reference_refuses_sdpa() -> None:
    """attention='sdpa' is torch's fused kernel: the reference refuses it instead of
    pretending, and the config refuses a path neither tree has."""
    with pytest.raises(ValueError, match="sdpa"):
        rgpt.GPT(GPTConfig(attention="sdpa", dropout=0.0), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="attention"):
        GPTConfig(attention="flash")


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_torchs_model_is_causal_on_both_attention_paths(device: str, attention: str) -> None:
    """Changing the last token leaves every earlier position's logits bit-identical, while
    the last position's logits move: the explicit path's masked_fill, or sdpa's
    is_causal=True, keeps each position from seeing the future (without it, they change)."""
    config = GPTConfig(attention=attention, dropout=0.0)
    model = tgpt.GPT(config, generator=torch.Generator().manual_seed(0), device=device).eval()
    g = torch.Generator().manual_seed(1)
    B, T = 2, config.block_size  # batch, time
    idx = torch.randint(0, config.vocab_size, (B, T), generator=g).to(device)
    targets = torch.randint(0, config.vocab_size, (B, T), generator=g).to(device)
    later = idx.clone()
    later[:, -1] = (later[:, -1] + 1) % config.vocab_size
    with torch.no_grad():
        logits, _ = model(idx, targets)  # (B, T, vocab): every position, given targets
        moved, _ = model(later, targets)
    assert logits.shape == (B, T, config.vocab_size)
    assert torch.equal(logits[:, :-1], moved[:, :-1]), "an earlier position saw the future"
    assert not torch.equal(logits[:, -1], moved[:, -1]), "the changed token changed nothing"
