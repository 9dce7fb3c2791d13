"""`python -m parity`: the command line (parity/cli/, one module per command)."""

import sys

from parity.cli import main

if __name__ == "__main__":
    sys.exit(main())
