"""attnbench: a benchmarking and profiling harness for attention backends."""

__version__ = "0.1.0"

#: Says that this `harness` is attnbench's: the name is generic, and another distribution's `harness/__init__.py`
#: (or a folder called harness/ found first on the path) lacks it. Checked at start by attnbench.py.
DISTRIBUTION = "attnbench"


def running_version() -> str:
    """The version of the attnbench that runs: its installed metadata when that describes this copy, else `__version__`.

    `__version__` is where pyproject reads the version from, so a checkout run without an install says it too; an
    installed distribution whose files are not these (an editable install, or another copy on the path) is not this one.
    """
    from importlib import metadata
    from pathlib import Path

    try:
        dist = metadata.distribution("attnbench")
    except metadata.PackageNotFoundError:
        return __version__
    installed = Path(str(dist.locate_file("harness/__init__.py")))
    if installed.is_file() and installed.resolve() == Path(__file__).resolve():
        return dist.version
    return __version__
