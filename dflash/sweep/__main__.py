"""`python -m dflash.sweep NAME`: see `dflash.sweep.cli`."""

import sys

from dflash.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
