"""The proof: what the two implementations (`reference`, `torch_impl`) must agree on, and
the tests that hold them to it.

    parity/claims/      the claim registry, one module per topic, beside the bound
                        derivations its reasons use (*_bounds.py, compile_gpt_ops.py)
    parity/drivers/     what runs both trees on an input, one module per topic; nothing else
    parity/strategies/  hypothesis strategies for the edge domains
    parity/compare.py   the measurement behind every claim kind (and the record of what
                        each claim observed, which the report prints)
    parity/oracles.py   exact oracles and which library has which format
    parity/sweep.py     the exhaustive format sweeps
    parity/fuzz_plugin.py  the hypothesis profile `fuzz` and its time budget, a pytest
                        plugin (conftest.py loads it; `python -m parity fuzz` runs it)
    parity/test_*.py    the parity tests, each assertion naming its claim

Nothing in here implements a mechanism, and nothing in here imports the lab (parity/lab/:
the command line, runners, report, docs generation and pictures), which sits on top.
"""
