"""`python -m metalqwen`: the `metalqwen` command."""

import sys

from .cli import main

sys.exit(main())
