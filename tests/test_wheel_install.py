"""A wheel built from the checkout installs into a fresh virtual environment that has torch, and works from another folder.

The environment is made from the base interpreter and sees this one's packages (torch, numpy, ...) through a folder of
links that leaves out attnbench's own install, so that the only attnbench it can import is the wheel's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import harness
from tests.checkout import copy_checkout


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command to its end, its text captured; a failure shows what it printed."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done


@pytest.mark.e2e
@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_runs_from_another_folder(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel offline (--no-build-isolation) needs setuptools here")
    checkout = copy_checkout(tmp_path / "checkout")  # the build writes build/ and *.egg-info: never into the real one
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", ".", "-w", str(tmp_path / "dist")], checkout)
    wheel = next((tmp_path / "dist").glob("attnbench-*.whl"))

    packages = tmp_path / "packages"  # this interpreter's packages, attnbench's own install left out
    packages.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "attnbench" not in entry.name and not entry.name.startswith("__editable__") and entry.suffix != ".pth":
            (packages / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    # No pip of its own (a Debian python3 without python3-venv has no ensurepip): this interpreter's pip installs into it.
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip()
    (Path(purelib) / "zz_outer_packages.pth").write_text(f"{packages}\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps", str(wheel)], tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNBENCH_BACKENDS")}
    command = str(venv / "bin" / "attnbench")
    assert Path(command).read_text().splitlines()[0] == f"#!{python}"  # the command runs the new environment's Python
    assert run([command, "--version"], elsewhere, env).stdout == f"attnbench {harness.__version__}\n"
    where = run([str(python), "-c", "import harness; print(harness.__file__)"], elsewhere, env).stdout.strip()
    assert where == str(Path(purelib) / "harness" / "__init__.py")
    listed = {row["name"]: row for row in json.loads(run([command, "backends", "--json"], elsewhere, env).stdout)}
    assert listed["naive"]["available"] and listed["sdpa"]["available"], listed
    assert (Path(purelib) / "harness" / "py.typed").is_file()
