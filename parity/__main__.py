"""`python -m parity`: the command line (parity/lab/cli/, one module per command)."""

import sys

from parity.lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
