"""`python -m harness` is the `attnbench` command (attnbench.py: it first checks that this `harness` is attnbench's)."""

import sys

from attnbench import main

sys.exit(main())
