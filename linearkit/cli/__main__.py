"""``python -m linearkit.cli ...``: the ``linearkit`` command (how ``--ranks`` relaunches itself
under mpirun)."""

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
