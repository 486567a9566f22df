"""`python -m benchmarks.serving ...` (see the package docstring)."""

import sys

from benchmarks.serving.cli import main

sys.exit(main())
