"""Record what measured it: attnbench's version (one definition), its git commit and whether the checkout was dirty,
in env.json and in every record; None, never a crash, outside a git checkout or without git."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.compat import tomllib
import harness
from harness import env as harness_env
from harness.env import HARNESS_ROOT, harness_identity
from harness.results.record import COLUMNS, Record
from harness.results.store import RunWriter, load_run, read_records
from harness.run.rundir import RunFolder
from harness.results.documents import ENV, Environment, Manifest, read_document
from tests.run_folders import CASES
from tests.synthetic_runs import synthetic_record

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fresh_identity():
    """harness_identity without what an earlier call cached."""
    harness_identity.cache_clear()
    yield harness_identity
    harness_identity.cache_clear()


def test_a_git_checkout_names_its_commit_and_whether_its_tracked_files_changed(tmp_path, fresh_identity):
    repo = tmp_path / "checkout"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "module.py").write_text("RULE = 1\n")
    _git(repo, "add", "module.py")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "results.csv").write_text("an untracked output is not a change to the code\n")
    assert fresh_identity(repo) == {"harness_version": harness.__version__, "harness_commit": head, "harness_dirty": False}
    (repo / "module.py").write_text("RULE = 2\n")
    fresh_identity.cache_clear()
    assert fresh_identity(repo) == {"harness_version": harness.__version__, "harness_commit": head, "harness_dirty": True}


def test_a_copy_that_is_no_git_checkout_or_a_machine_without_git_gives_none(tmp_path, fresh_identity, monkeypatch):
    copy = tmp_path / "unpacked"
    (copy / "harness").mkdir(parents=True)
    (copy / "harness" / "__init__.py").write_text("")
    assert fresh_identity(copy) == {"harness_version": harness.__version__, "harness_commit": None, "harness_dirty": None}
    # A folder inside another checkout is not that checkout: its commit is not what measured.
    inside = tmp_path / "repo" / "vendored"
    inside.mkdir(parents=True)
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "commit", "-q", "--allow-empty", "-m", "x")
    assert fresh_identity(inside)["harness_commit"] is None
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    fresh_identity.cache_clear()
    assert shutil.which("git") is None
    assert fresh_identity(ROOT) == {"harness_version": harness.__version__, "harness_commit": None, "harness_dirty": None}


def test_the_version_is_defined_once_and_pyproject_reads_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "harness.__version__"}
    assert HARNESS_ROOT == ROOT


def test_every_record_a_run_writes_and_its_env_json_name_what_measured_them(tmp_path, monkeypatch):
    identity = {"harness_version": harness.__version__, "harness_commit": "c0ffee" * 6 + "c0ff", "harness_dirty": True}
    monkeypatch.setattr("harness.results.store.harness_identity", lambda: identity)
    writer = RunWriter(tmp_path)
    writer.append(synthetic_record(CASES[0], "naive", 1.0))
    (row,) = read_records(tmp_path).records
    assert {k: row[k] for k in identity} == identity
    assert {"harness_version", "harness_commit", "harness_dirty"} <= set(COLUMNS)
    frame = load_run(tmp_path)
    assert frame["harness_commit"].tolist() == [identity["harness_commit"]] and frame["harness_dirty"].tolist() == [True]
    # A record written before these columns existed still reads, saying it does not know.
    old = {k: v for k, v in row.items() if k not in identity}
    assert Record.from_dict(old).harness_commit is None

    monkeypatch.setattr(harness_env, "harness_identity", lambda: identity)
    folder = RunFolder(tmp_path, Manifest(run_id="r", device="cpu"))
    folder.write_env_before()
    folder.write_env_after()
    before = read_document(tmp_path / ENV, Environment).before
    assert {k: before[k] for k in identity} == identity
    assert "after" not in json.loads((tmp_path / ENV).read_text())  # nothing reads a fingerprint after: it is not written


def test_the_fingerprint_writes_the_fields_harness_env_names_and_env_json_types_them_by_those_names():
    """One home for the fingerprint's field names (harness.env): what `fingerprint` writes, what env.json's reader types,
    what compare judges and what the report lists all come from it."""
    from harness.analysis import compare
    from harness.env import CUDA_KEYS, DEVICE_KEYS, FINGERPRINT_KEYS, IDENTITY_KEYS, VERSION_KEYS, fingerprint
    from harness.errors import UserError

    written = fingerprint("cpu")
    assert list(written) == [k for k in FINGERPRINT_KEYS if k not in CUDA_KEYS]  # every field named, in the shown order
    for key in DEVICE_KEYS + VERSION_KEYS + IDENTITY_KEYS:
        with pytest.raises(UserError, match=key):
            Environment.from_dict({"before": {key: [1]}}, where="env.json")
    base, new = {"before": dict(written)}, {"before": {**written, "torch": "0.0", "device_name": "other"}}
    assert compare.environment_differences(base, new) == [f"device_name: {written['device_name']} → other",
                                                          f"torch: {written['torch']} → 0.0"]
