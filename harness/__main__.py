"""`python -m harness` is the `attnbench` command."""

import sys

from harness.cli import main

sys.exit(main())
