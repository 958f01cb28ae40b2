"""Set-up on a box like the H200's: `python3` is a venv holding torch, and no package index is reachable.

The "box python" is a venv of the base interpreter (no system site packages) whose site-packages
holds, as symlinks, the packages of the interpreter running these tests, torch included, minus
attnbench itself (it must come from the checkout) and whatever a test leaves out. Nothing is
pip-installed: every pip setting points at nothing, so any download fails the run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.compat import tomllib
from harness.results.store import read_records  # one row per pair: a re-measure stands in its first row's place
from tests.checkout import copy_checkout
from harness.cli.main import main
from harness.env import OLDEST_TORCH, torch_version_problem

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup-env.sh"
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)
PROXIES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def _purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())


#: The H200 image's package list: what its python3 holds, and all `make bench` and `make gpu-check` may need.
IMAGE_PACKAGES = Path(__file__).with_name("h200_image_packages.txt")  # a copy of ../shared/data/h200-image-packages.txt


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_package_names(listing: Path = IMAGE_PACKAGES) -> set[str]:
    """The (normalized) distribution names the image's package list holds."""
    return {_normalized(line.strip()) for line in listing.read_text().splitlines() if line.strip() and not line.startswith("#")}


#: A distribution of the CPU venv that the image holds under another name, providing the same module (`cpuinfo`).
SAME_MODULE_AS = {"py-cpuinfo2": "py-cpuinfo"}


def entries_not_on(names: set[str]) -> tuple[str, ...]:
    """The site-packages entries (top-level modules, their .dist-info, .pth files) of this interpreter's distributions outside `names`."""
    entries = set()
    for dist in importlib.metadata.distributions():
        name = _normalized(dist.metadata["Name"])
        if SAME_MODULE_AS.get(name, name) not in names:
            entries.update(Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith(".."))
    return tuple(sorted(e for e in entries if e != "__pycache__"))


def _box_python(where: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A venv python that holds this interpreter's packages (not attnbench, nor `leave_out`), like the H200's python3."""
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    holds = _purelib(python)
    skip = ("__editable__", "attnbench", *leave_out)
    for source in site.getsitepackages():
        for entry in Path(source).iterdir():
            if not entry.name.startswith(skip) and not (holds / entry.name).exists():
                (holds / entry.name).symlink_to(entry)
    return python


def _offline_env(box: Path, **extra: str) -> dict[str, str]:
    """The environment with the box's bin/ first on PATH and every way pip could fetch something closed."""
    # MAKEFLAGS/MAKELEVEL: under `make test` the inner make would print "Entering directory" lines a user's never does.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k.lower() not in PROXIES
           and k not in ("CI", "PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    env.update(PATH=f"{box / 'bin'}{os.pathsep}{env['PATH']}", PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull,
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="", PIP_RETRIES="0", PIP_TIMEOUT="2", **extra)
    return env


def _torch_of(python: Path) -> tuple[str, str]:
    out = subprocess.run([str(python), "-c", "import torch; print(torch.__version__); print(torch.__file__)"],
                         check=True, capture_output=True, text=True).stdout.split("\n")
    return out[0], out[1]


@pytest.fixture(scope="module")
def whole_box(tmp_path_factory) -> tuple[Path, tuple[str, str]]:
    """A box python that leaves nothing out, and its torch (version, file): each `import torch` costs seconds, and no test writes into it."""
    python = _box_python(tmp_path_factory.mktemp("whole") / "box")
    return python, _torch_of(python)


@pytest.fixture(scope="module")
def image_box(tmp_path_factory) -> tuple[Path, tuple[str, str]]:
    """A box python holding only packages on the H200 image's list (no SQLAlchemy, no psycopg), and its torch (version, file)."""
    python = _box_python(tmp_path_factory.mktemp("image") / "box", leave_out=entries_not_on(image_package_names()))
    return python, _torch_of(python)


def _setup(python: Path, venv: Path, purpose: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SETUP), str(python), str(venv), purpose], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _recording_pip(tmp_path: Path) -> tuple[str, Path]:
    """A command for ATTNBENCH_PIP that records its arguments, one call a line, and installs nothing."""
    log = tmp_path / "pip-calls.txt"
    fake = tmp_path / "recording-pip"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\n')
    fake.chmod(0o755)
    return str(fake), log


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_make_bench_on_a_box_holding_only_the_image_packages_keeps_its_torch_and_reports(tmp_path, image_box):
    box_python, box_torch = image_box
    box = box_python.parents[1]
    assert box_torch[1].startswith(str(box)), "the box python must hold torch itself"
    for absent in ("sqlalchemy", "psycopg", "pydantic"):  # what the image lacks is absent from the box
        assert subprocess.run([str(box_python), "-c", f"import {absent}"], capture_output=True).returncode != 0, absent
    repo = copy_checkout(tmp_path / "repo")  # as CI's clean clone is one of main
    suite = tmp_path / "tiny.toml"
    suite.write_text('name = "tiny"\ndevice = "cpu"\nbackends = ["naive", "sdpa"]\n'
                     "[budget]\nwarmup_s = 0.01\nmeasure_s = 0.02\n"
                     '[[grid]]\nB = [1]\nS = [32]\nH = [2]\nH_kv = ["H"]\nd_k = [16]\ndtype = ["fp32"]\ncausal = [false]\n')
    venv = tmp_path / "venv"
    env = _offline_env(box)
    done = subprocess.run(["make", "bench", "PYTHON=python3", f"VENV={venv}", f"SUITE={suite}",
                           f"ARGS=--backends naive,sdpa --out {tmp_path / 'results'} --run-id offline"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "setup: nothing to install" in done.stdout and "installing" not in done.stdout, done.stdout
    assert _torch_of(venv / "bin" / "python") == box_torch
    assert not any(p.name.startswith("torch") for p in _purelib(venv / "bin" / "python").iterdir()), "a torch of its own"
    run = tmp_path / "results" / "offline"
    rows = read_records(run).records
    assert sorted(r["backend"] for r in rows) == ["naive", "sdpa"] and {r["status"] for r in rows} == {"ok"}
    assert json.loads((run / "env.json").read_text())["before"]["torch"] == box_torch[0]
    last = done.stdout.strip().splitlines()[-1]
    # The report lies beside --out (a run into tmp/results reports into tmp/reports), never in the checkout whatever --out says.
    page = tmp_path / "reports" / "offline" / "index.html"
    assert last == f"report: {page}" and page.is_file() and not (repo / "reports" / "offline").exists(), last
    # gpu-check runs on the box's python3 itself, with nothing installed: here on its CPU grid, each pair in a child process.
    gpu = subprocess.run(["make", "gpu-check", "PYTHON=python3", "ARGS=--cpu --backends naive"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert gpu.returncode == 0 and "Traceback" not in gpu.stdout + gpu.stderr, gpu.stdout[-2000:] + gpu.stderr[-2000:]
    # Every case naive computes agrees; it refuses the FP8 one (no FP8 kernel); nothing fails.
    assert re.search(r"^naive +(\d+) +\1 +1 +0 ", gpu.stdout, re.M), gpu.stdout[-2000:]
    # A results-database command says in one line what to install, and exits 2.
    db = subprocess.run([str(venv / "bin" / "python"), "-m", "harness", "db", "add", str(run), "--db", str(tmp_path / "r.sqlite")],
                        cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert db.returncode == 2 and db.stderr.count("\n") == 1, db.stderr
    assert db.stderr.startswith("attnbench: error: the results database needs sqlalchemy>=2.0") and "pip install 'sqlalchemy>=2.0'" in db.stderr
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.slow
def test_a_box_python_missing_one_test_package_gets_only_that_with_torch_held(tmp_path, whole_box):
    box_python = _box_python(tmp_path / "box", leave_out=("pytest_timeout",))
    version = whole_box[1][0]  # the same torch, linked into both boxes
    pip, log = _recording_pip(tmp_path)
    env = _offline_env(tmp_path / "box", ATTNBENCH_PIP=pip)
    venv = tmp_path / "venv"
    bench = _setup(box_python, venv, "bench", env)
    assert bench.returncode == 0, bench.stderr
    assert _calls(log) == [] and "setup: nothing to install" in bench.stdout
    test = _setup(box_python, venv, "test", env)
    assert test.returncode == 0, test.stderr
    constraint = venv / "attnbench-torch-constraint.txt"
    ray = [] if importlib.util.find_spec("ray") else [f"install --quiet -c {constraint} ray>=2.8"]
    assert _calls(log) == [f"install --quiet -c {constraint} pytest-timeout>=2.1", *ray]
    assert constraint.read_text() == f"torch=={version}\n"
    assert "installing only what is missing: pytest-timeout>=2.1" in test.stdout


@pytest.mark.slow
def test_a_missing_package_that_cannot_be_fetched_stops_setup_with_one_line(tmp_path):
    # Without pip either: the venv gets the pip bundled with Python (offline), which then finds no index.
    box_python = _box_python(tmp_path / "box", leave_out=("pytest_timeout", "pip"))
    venv = tmp_path / "venv"
    done = _setup(box_python, venv, "test", _offline_env(tmp_path / "box"))
    assert done.returncode == 1
    assert "setup: could not install pytest-timeout>=2.1 (is a package index reachable?)" in done.stderr
    assert (_purelib(venv / "bin" / "python") / "pip").is_dir()


@pytest.mark.slow
def test_a_venv_left_by_an_earlier_setup_is_made_to_see_the_box_torch(tmp_path, whole_box):
    box_python, box_torch = whole_box
    venv = tmp_path / "venv"
    # What the earlier script built: a venv of the base interpreter, which sees no torch.
    subprocess.run([str(box_python), "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    done = _setup(box_python, venv, "bench", _offline_env(box_python.parents[1]))
    assert done.returncode == 0, done.stderr
    assert _torch_of(venv / "bin" / "python") == box_torch


@pytest.mark.slow
def test_a_venv_with_a_torch_of_its_own_is_refused_not_used(tmp_path, whole_box):
    box_python = whole_box[0]
    venv = tmp_path / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    own = _purelib(venv / "bin" / "python") / "torch"
    own.mkdir()
    (own / "__init__.py").write_text('__version__ = "2.13.0"\n')
    done = _setup(box_python, venv, "bench", _offline_env(box_python.parents[1]))
    assert done.returncode == 1
    assert f"setup: {venv} sees torch '2.13.0 {own / '__init__.py'}', not {box_python}'s: remove {venv}" in done.stderr


def test_without_torch_the_cpu_build_xformers_and_attnbench_are_installed_as_before(tmp_path):
    if subprocess.run([BASE_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"the base interpreter {BASE_PYTHON} holds torch: there is no machine without torch to set up here")
    venv = tmp_path / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip, log = _recording_pip(tmp_path)
    env = _offline_env(tmp_path / "nowhere", ATTNBENCH_PIP=pip)
    done = _setup(Path(BASE_PYTHON), venv, "bench", env)
    # The fake pip installs nothing, so the last check (import torch) fails after the calls it records.
    assert done.returncode != 0
    assert _calls(log) == ["install --quiet torch==2.13.0", "install --quiet --no-deps xformers==0.0.35", "install --quiet -e .[test]"]


def test_the_script_asks_for_what_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    script = SETUP.read_text()

    def listed(variable: str) -> list[str]:
        line = next(line for line in script.splitlines() if line.startswith(f"{variable}="))
        return [pair.split(":", 1)[1] for pair in line.split("=", 1)[1].strip('"').split()]

    # A requirement of one Python only (tomli, 3.10) is listed without its marker: the script asks for it where its module is missing.
    assert ["torch>=2.11", *listed("RUNTIME_NEEDS")] == [d.split(";")[0].strip() for d in project["dependencies"]]
    assert listed("TEST_NEEDS") == project["optional-dependencies"]["test"]
    # The results database is no runtime need (the GPU box has no SQLAlchemy), but `make test` installs all its extra holds.
    assert not any(d.startswith(("sqlalchemy", "psycopg")) for d in project["dependencies"])
    assert set(project["optional-dependencies"]["db"]) <= set(listed("TEST_NEEDS"))


def test_the_oldest_torch_is_declared_once_and_refused_below_it(monkeypatch, capsys):
    declared = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if d.startswith("torch"))
    assert declared == "torch>=" + ".".join(map(str, OLDEST_TORCH))
    assert torch_version_problem("2.11.0+cu130") is None and torch_version_problem("2.13.0") is None
    assert torch_version_problem("2.10.1+cu128") == "torch 2.10.1+cu128 is installed; attnbench needs torch >= 2.11"
    assert "cannot read" in torch_version_problem("nightly")
    monkeypatch.setattr(torch, "__version__", "2.10.0")
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err == "attnbench: error: torch 2.10.0 is installed; attnbench needs torch >= 2.11\n"
