"""What runs both trees on an input: one module per topic (parity/drivers/<topic>.py).

A driver builds the same input for the reference and for torch_impl, runs both, and returns
the pairs (and the scales S of `eps` claims) that a claim compares. The parity tests, the
report's quick checks (parity/checks/), the pictures and the benchmarks import drivers; a
driver never asserts: judging is parity/compare.py's job, with the claim's declared bound.
"""
