"""`python -m moe.hf export|import` (see `moe/hf/commands.py`)."""

import sys

from moe.hf.commands import main

sys.exit(main())
