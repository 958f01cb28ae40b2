"""`python -m harness` is the `attnbench` command (attnbench.py: it first checks that this `harness` is attnbench's)."""

from harness.process.fast_exit import end_process

try:
    from attnbench import main
except ModuleNotFoundError as exc:
    if exc.name != "attnbench":
        raise
    # An editable install made before attnbench.py existed maps `harness` alone (`pip install -e .` again adds it);
    # this is that install's own harness running, so the command itself still works.
    from harness.cli.main import main

end_process(main)
