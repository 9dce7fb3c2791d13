"""Parity harness: the claim table, edge-case strategies, comparisons, the report and the CLI.

Nothing in here implements a mechanism; it only states what the two implementations
(`reference`, `torch_impl`) must agree on, and checks it.
"""
