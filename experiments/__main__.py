"""``python -m experiments NAME [options]``: run one experiment (see ``experiments``)."""

import sys

from . import main

sys.exit(main())
