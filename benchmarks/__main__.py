"""``python -m benchmarks``: run the suite (see ``benchmarks.run``)."""

import sys

from .run import main

sys.exit(main())
