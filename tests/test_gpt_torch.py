"""torch_impl's transformer on its own: what only the torch tree runs (attention="sdpa")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.gpt_config import GPTConfig
from reference import gpt as rgpt
from torch_impl import gpt as tgpt


def test_the_reference_refuses_sdpa_and_torchs_sdpa_model_is_causal(device: str) -> None:
    """attention='sdpa' is torch's fused kernel: the reference refuses it instead of
    pretending, and torch's model runs it causally: changing the last token leaves every
    earlier position's logits bit-identical (a call without is_causal=True lets each
    position see the future, and changes them), while the last position's logits move."""
    config = GPTConfig(attention="sdpa", dropout=0.0)
    with pytest.raises(ValueError, match="sdpa"):
        rgpt.GPT(config, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="attention"):
        GPTConfig(attention="flash")
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
