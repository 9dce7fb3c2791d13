"""How many examples a test with a budget of its own runs under each hypothesis profile.

A test whose examples cost more than most says so with `@settings(examples(n))` instead of
`@settings(max_examples=n)`: n under the everyday profiles (dev, ci), at most the profile's
own count under `report` (a quick, reproducible run), and the profile's own count under
`fuzz` (many: its time budget ends each test, parity/fuzz_plugin.py). An explicit max_examples wins
over any profile; this is how a profile still decides, through hypothesis' public settings
only (the current profile's name and its settings), read when the test is decorated, after
pytest loaded the profile it was asked for.
"""

from __future__ import annotations

from hypothesis import settings

CAPPED, RAISED = ("report",), ("fuzz",)  # profiles (conftest.py) that cap / raise budgets


def examples(n: int) -> settings:
    """The settings of a test with its own budget of n examples (module docstring)."""
    profile = settings.get_current_profile_name()
    own = settings.default.max_examples
    if profile in CAPPED:
        n = min(n, own)
    elif profile in RAISED:
        n = own
    return settings(max_examples=n)
