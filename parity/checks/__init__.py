"""Quick checks for `python -m parity report`, one module per topic (see parity/report.py)."""
