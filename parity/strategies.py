"""Named hypothesis strategies for edge domains, shared by the tests and `python -m parity fuzz`.

A test that targets an edge also shows the edge was reached (hypothesis.event / target,
or an explicit guard). One section per topic.
"""

from __future__ import annotations

# ---------------------------------------------------------------- formats

# ---------------------------------------------------------------- nn

# ---------------------------------------------------------------- optim

# ---------------------------------------------------------------- data
