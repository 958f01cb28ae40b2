"""`python -m harness` is the `attnbench` command."""

import sys

from harness.cli.main import main

sys.exit(main())
