"""`python -m parity`: the command line (parity/lab/cli/, one module per command)."""

import sys

from parity import setting

if sys.argv[1:2] in (["fuzz"], ["sweep"]):  # claims checked here: their setting, before NumPy
    setting.pin_blas()

from parity.lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
