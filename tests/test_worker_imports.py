"""Workers import what the user's process imports: relative PYTHONPATH entries and the folder `python -m` ran in reach
every child, and a run whose workers cannot load a plugin the supervisor loaded refuses to start, saying why."""

from __future__ import annotations

import os
import sys

import pytest

from harness.backends.registry import ENV_VAR, load_registry
from harness.process import forkserver
from harness.process.children import ROOT as CHILD_ROOT
from harness.process.children import child_env
from harness.run.plugin_probe import plugin_backends
from tests.cli_runs import ROOT, assert_one_line_error, attnbench, attnbench_in_process, rows

#: Two quick cases (causal and not), small enough for two shared cores.
ONLY = "B1-Sq128-Skv128-H8-Hkv2-dk64-fp32"
#: A user's plugin as a file in their folder: SDPA under another name.
PLUGIN_SOURCE = """
import torch.nn.functional as F

from harness.backends import Backend


class MyAttention(Backend):
    name = "my-attention"
    family = "example"
    native_gqa = True

    def prepare(self, case, inputs):
        q, k, v, causal = inputs.q, inputs.k, inputs.v, case.causal
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
"""


def test_relative_pythonpath_entries_are_made_absolute_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(ROOT)])  # the folder is not on this process's path (the `attnbench` script)
    env = child_env({"PYTHONPATH": os.pathsep.join([".", "plugins", "", "/abs/dir"]), "KEEP": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(tmp_path / "plugins"), "/abs/dir"]
    assert env["KEEP"] == "1"


def test_the_working_directory_goes_first_when_this_process_has_it_on_its_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(ROOT)])  # what `python -m harness` run in tmp_path has
    assert child_env({"PYTHONPATH": "/abs/dir"})["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/abs/dir"]
    monkeypatch.setattr(sys, "path", [str(ROOT)])
    assert "PYTHONPATH" not in child_env({})


def test_only_plugin_backends_are_probed(tmp_path, monkeypatch):
    (tmp_path / "probe_listed_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "probe_listed_plugin:MyAttention,probe_listed_missing:Nothing")
    registry = load_registry()
    assert plugin_backends(registry, ["naive", "my-attention", "probe_listed_missing:Nothing", "sdpa"]) == ["my-attention"]


@pytest.mark.e2e
@pytest.mark.parametrize("workers, origin", [({}, "a fork of the attnbench command"),
                                             ({forkserver.ENV_SWITCH: "0"}, "-m harness.child worker --run-dir")],
                         ids=["forked-from-the-command", "fresh-interpreters"])
def test_a_plugin_found_through_a_relative_pythonpath_runs_in_the_workers(tmp_path, workers, origin):
    # The README's recipe as a user types it in the folder holding the plugin: PYTHONPATH=. (ROOT: this checkout's harness).
    # The command forks its CPU workers' template from itself; fresh interpreters (as CUDA workers start) must find it too.
    (tmp_path / "my_attention.py").write_text(PLUGIN_SOURCE)
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "ATTNBENCH_TEST_LOG")}
    env.update({ENV_VAR: "my_attention:MyAttention", "PYTHONPATH": f".{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1", **workers})
    done = attnbench(["run", "--suite", "quick", "--backends", "my-attention", "--only", ONLY, "--device", "cpu",
                      "--out", "results", "--run-id", "r", "--quiet"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = rows(tmp_path / "results" / "r")
    assert sorted((r["case_id"], r["status"]) for r in records) == [(ONLY, "ok"), (f"{ONLY}-causal", "ok")], records
    assert origin in (tmp_path / "results" / "r" / "worker-0.log").read_text()


@pytest.mark.e2e
def test_a_run_refuses_to_start_when_a_worker_cannot_load_a_plugin_this_process_loaded(tmp_path, monkeypatch, capsys):
    # A folder put on sys.path by hand (a notebook, a wrapper script) is this process's alone: no child sees it.
    plugins = tmp_path / "by_hand"
    plugins.mkdir()
    (plugins / "probe_by_hand_plugin.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNBENCH_TEST_LOG",)}
    env.update({ENV_VAR: "probe_by_hand_plugin:MyAttention", "PYTHONPATH": str(ROOT)})
    ran = attnbench_in_process(["run", "--suite", "quick", "--backends", "naive,my-attention", "--only", ONLY, "--device", "cpu",
                                "--out", tmp_path / "results", "--run-id", "r", "--quiet"], capsys, env=env, monkeypatch=monkeypatch)
    assert_one_line_error(ran, "backend my-attention loads in this process but not in a worker process", str(CHILD_ROOT),
                          "ATTNBENCH_BACKENDS entry probe_by_hand_plugin:MyAttention failed to load",
                          "ModuleNotFoundError: No module named 'probe_by_hand_plugin'")
    assert not (tmp_path / "results").exists()
