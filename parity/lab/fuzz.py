"""`python -m parity fuzz`: pytest on the parity tests under the hypothesis profile `fuzz`,
for a total time (parity/fuzz_plugin.py does the fuzzing; this builds its command line).

    --seconds S   ->  --fuzz-total S: only the @given tests, S s of wall time shared among them
    --topic T     ->  the topic's test files (report.parity_test_files), else parity/
    --seed N      ->  --hypothesis-seed N (a random one when not given, printed first)
    --device D    ->  --device D

The run keeps the project's pytest settings (pyproject.toml's addopts: pytest-xdist over every
core, `--dist loadfile`; the default selection, `not slow`), and pytest's output is the
command's. Its exit status is pytest's, read as the command line's (parity.lab.cli's
EXIT_STATUSES): 0 every target ran, none failed; 1 a test failed (pytest's internal error
too); 4 the budget ran out before a test was reached (the plugin's status); pytest's
"interrupted" is 130; "no tests collected" (a topic whose tests have no @given test) is a
one-line error, 2.
"""

from __future__ import annotations

import random
import subprocess
import sys

from parity.lab.cli import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, UsageError
from parity.lab.report import PARITY, ROOT, parity_test_files

# pytest's exit statuses (pytest.ExitCode's values) -> the command line's; 4 is the plugin's
STATUS = {0: EXIT_OK, 1: EXIT_FAILED, 2: EXIT_INTERRUPTED, 3: EXIT_FAILED, 4: EXIT_INCOMPLETE}
NO_TESTS = 5  # pytest: no test selected


def pytest_command(seconds: float, topic: str | None, device: str, seed: int) -> list[str]:
    """The pytest command line `fuzz` runs (module docstring)."""
    files = parity_test_files(topic) if topic is not None else [PARITY]
    return [sys.executable, "-m", "pytest", *(f.relative_to(ROOT).as_posix() for f in files),
            "--hypothesis-profile=fuzz",
            f"--fuzz-total={seconds!r}", f"--hypothesis-seed={seed}", f"--device={device}"]


def fuzz(seconds: float, topic: str | None = None, device: str = "cpu",
         seed: int | None = None) -> int:
    """Run the fuzz profile's pytest (module docstring); return the exit status."""
    seed = random.randrange(2**32) if seed is None else seed
    command = pytest_command(seconds, topic, device, seed)
    print(f"fuzz: {seconds:g} s, seed {seed}: pytest {' '.join(command[3:])}", flush=True)
    status = subprocess.run(command, cwd=ROOT, check=False).returncode  # in ROOT: its paths
    if status == NO_TESTS:
        raise UsageError(f"--topic {topic}: its tests have no @given test, nothing to fuzz"
                         if topic else "no @given test found in parity/")
    return STATUS.get(status, EXIT_FAILED)
