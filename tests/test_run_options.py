"""The run options are declared once (harness.results.run_options): the manifest, `--resume`'s refusals, the pytest
plugin's options and `repro` are built from its fields, so a field added there reaches each of them."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

import pytest

from harness.cli import main as cli_main
from harness.errors import UserError
from harness.measure.timing import Budget
from harness.results.field_checks import _count
from harness.results.documents import Manifest
from harness.results.run_options import ORDER_SCHEME, RunOptions, _option, options
from harness.run import pytest_plugin, repro

ASKED = RunOptions(timer="kernels", check=False, energy=True, profile=True, traces=True, cooldown_s=30.0, order_seed=5,
                   budget=Budget(warmup_s=0.003, measure_s=0.04, min_rounds=7, precision=0.02))

#: A field nobody else knows of, added the way a new option would be.
Extended = dataclasses.make_dataclass("Extended", [("tiles", int, _option(4, check=_count, flag="--tiles"))],
                                      bases=(RunOptions,), frozen=True)


def test_the_manifest_keeps_the_keys_every_attnbench_wrote_and_reads_them_back():
    stored = ASKED.to_manifest()
    assert set(stored) == {"timer", "check", "energy", "profile", "traces", "cooldown_s", "order", "budget", "threads", "remeasure"}
    assert stored["order"] == {"scheme": ORDER_SCHEME, "seed": 5} and stored["budget"]["min_rounds"] == 7
    assert RunOptions.from_manifest(stored, "manifest.json") == ASKED
    assert Manifest.from_dict({"run_id": "r", **stored}, "manifest.json").options == ASKED
    # A folder from before the order and the budget were recorded: the default order, its suite's budget (None).
    assert RunOptions.from_manifest({"timer": "graph"}, "m.json") == RunOptions(timer="graph")


def test_options_are_checked_naming_the_option_or_the_manifest_key():
    with pytest.raises(UserError, match="'--timer' has value 'fast'"):
        RunOptions(timer="fast")
    with pytest.raises(UserError, match="--traces goes with --profile"):
        RunOptions(traces=True)
    with pytest.raises(UserError, match=r"m.json: field 'order.seed' has value -1"):
        RunOptions.from_manifest({"order": {"seed": -1}}, "m.json")
    with pytest.raises(UserError, match=r"m.json: field 'budget': budget field 'min_rounds'"):
        RunOptions.from_manifest({"budget": {"min_rounds": 0}}, "m.json")


def test_repro_repeats_the_options_that_change_what_a_pair_records_in_the_order_it_always_did():
    assert ASKED.run_words() == ["--timer", "kernels", "--no-check", "--energy", "--profile", "--traces"]
    assert RunOptions().run_words() == ["--timer", "events"]


def _run_action(flag: str) -> argparse.Action:
    run = next(a for a in cli_main.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    return next(a for a in run._actions if flag in a.option_strings)


@pytest.mark.parametrize("name", [f.name for f, spec in options() if spec.flag is not None])
def test_every_flagged_option_is_a_run_flag_and_refused_by_resume(name, capsys):
    spec = dict((f.name, s) for f, s in options())[name]
    action = _run_action(spec.flag)
    assert action.dest == spec.dest
    given = [spec.flag] if action.nargs == 0 else [spec.flag, action.choices[-1] if action.choices else "3"]
    # With --profile beside it, since --traces alone is refused for its own reason.
    assert cli_main.main(["run", "--resume", "/nonexistent/run", "--quiet", "--profile", *given]) == 2
    err = capsys.readouterr().err
    assert spec.flag in err.split("describes it; ")[1].split(" cannot change it")[0].split(", "), err


def test_the_pytest_plugin_takes_the_options_it_always_took():
    class Group:
        def __init__(self):
            self.added = {}

        def addoption(self, name, **kwargs):
            self.added[name] = kwargs

    group = Group()
    pytest_plugin.pytest_addoption(type("Parser", (), {"getgroup": lambda self, name: group})())
    options_taken = {name: kw for name, kw in group.added.items() if name not in
                     ("--attnbench-suite", "--attnbench-run-dir", "--attnbench-backends", "--attnbench-device")}
    assert sorted(options_taken) == ["--attnbench-energy", "--attnbench-no-check", "--attnbench-profile",
                                     "--attnbench-threads", "--attnbench-timer", "--attnbench-traces"]
    assert options_taken["--attnbench-timer"]["default"] == "events" and options_taken["--attnbench-no-check"]["action"] == "store_true"


def test_a_new_field_reaches_the_manifest_resume_and_repro_without_an_edit_elsewhere(monkeypatch):
    wide = Extended(tiles=7)
    assert wide.to_manifest()["tiles"] == 7 and Extended.from_manifest(wide.to_manifest(), "m.json") == wide
    with pytest.raises(UserError, match="m.json: field 'tiles' has value -2"):
        Extended.from_manifest({"tiles": -2}, "m.json")
    assert wide.run_words()[-2:] == ["--tiles", "7"]

    monkeypatch.setattr(repro, "RunOptions", Extended)
    words = shlex.split(repro.repro_command({"device": "cpu", "tiles": 9}, "/runs/r", "B1-Sq8", "naive"))
    assert words[-2:] == ["--tiles", "9"]

    monkeypatch.setattr(cli_main, "RunOptions", Extended)
    args = cli_main.build_parser().parse_args(["run", "--resume", "/nonexistent/run", "--quiet"])
    args.tiles = 3
    with pytest.raises(UserError, match="--tiles cannot change it"):
        cli_main.cmd_run(args)
