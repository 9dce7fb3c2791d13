"""The graph-break catalogue: seeded breaks in a forward pass, each with its repair.

Each entry is a pair of forwards `(model, x) -> probabilities` computing the same values,
the first written the way people write it, the second the way Dynamo captures in one graph.
In eager mode the two are bit-identical (the repair changes where a value lives, a Python
number or a tensor, never the arithmetic); claim compile.breaks holds them to it, and to
the capture counts torch._dynamo.explain reports. docs/compile.md shows the code of each
pair (parity/lab/gendocs/compile.py reads it with inspect) and the committed counts.

Every broken forward does torch work after its break, so the break leaves two graphs (a
break with no torch op after it is listed among explain's reasons but counted in no graph).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

# The first of the checked versions (2.6, 2.11, 2.13) where fullgraph=True captures `.item()`
# and nonzero's size as unbacked symbols instead of refusing them; 2.6 raises.
FULLGRAPH_CAPTURES_SCALARS = (2, 11)

Forward = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def item_broken(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    scale = h.abs().max().item()  # a Python float: the graph must end to produce it
    return (h / scale).softmax(-1)


def item_repaired(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    scale = h.abs().amax()  # a 0-d tensor: stays in the graph
    return (h / scale).softmax(-1)


def print_broken(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    print(f"mean logit {h.mean():.4f}")  # formatting needs the value now
    return h.softmax(-1)


def print_repaired(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)  # log outside: return what to print, print it after the call
    return h.softmax(-1)


def branch_broken(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    if h.mean() > 0:  # Python control flow on a tensor's value
        h = h - h.mean()
    return h.softmax(-1)


def branch_repaired(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    m = h.mean()
    h = torch.where(m > 0, h - m, h)  # both sides computed, one selected, in the graph
    return h.softmax(-1)


def numpy_broken(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    inside = np.interp(h.detach().cpu().numpy(), (-1.0, 1.0), (-1.0, 1.0))  # clip, by table
    return (h - torch.from_numpy(inside.astype(np.float32)).to(h.device)).softmax(-1)


def numpy_repaired(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    inside = h.detach().clamp(-1.0, 1.0)  # the same values (detached, as NumPy's were)
    return (h - inside).softmax(-1)


def nonzero_broken(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    positive = torch.nonzero(h > 0).shape[0]  # output shape depends on the data
    return (h / positive).softmax(-1)


def nonzero_repaired(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = model(x)
    positive = (h > 0).sum()  # the count as a 0-d tensor: fixed shape
    return (h / positive).softmax(-1)


@dataclass(frozen=True)
class Entry:
    """One seeded break: its name, the two forwards, why it breaks, what the repair does."""

    name: str
    broken: Forward
    repaired: Forward
    cause: str
    repair: str
    # fullgraph=True on torch >= FULLGRAPH_CAPTURES_SCALARS records the value as an unbacked
    # symbol (capture_scalar_outputs / capture_dynamic_output_shape_ops turned on for a
    # fullgraph capture) instead of raising; without fullgraph it still breaks
    fullgraph_captures: bool = False


CATALOGUE: tuple[Entry, ...] = (
    Entry("item", item_broken, item_repaired,
          "`.item()` returns a Python float; Dynamo would have to run the graph to know it",
          "keep the value a 0-d tensor (`amax()` instead of `max().item()`)",
          fullgraph_captures=True),
    Entry("print", print_broken, print_repaired,
          "`print` of a tensor's value is a side effect that needs the value now",
          "return the value and print it after the compiled call"),
    Entry("branch", branch_broken, branch_repaired,
          "`if tensor:` decides which Python code runs from a tensor's value",
          "compute both sides and select with `torch.where` (or `torch.cond`)"),
    Entry("numpy", numpy_broken, numpy_repaired,
          "a NumPy function Dynamo cannot translate (`np.interp`); the ones torch._numpy "
          "implements (`np.clip`, `np.median`, ...) are traced into the graph and do not break",
          "the same computation in torch (`clamp`; np.interp with the identity table on "
          "[-1, 1] is exactly a clip)"),
    Entry("nonzero", nonzero_broken, nonzero_repaired,
          "`nonzero` has a data-dependent output shape, and `.shape[0]` hands it to Python",
          "count with a fixed-shape reduction (`(h > 0).sum()`)", fullgraph_captures=True),
)
