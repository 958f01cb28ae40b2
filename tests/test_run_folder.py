"""The run folder: --force deletes only a run's folder, a damaged manifest is named, capabilities are recorded; the manifest
holds the pairs and the budget, the records are read once, the progress count reads only what was appended."""

import dataclasses
import json

import pytest

from harness.cli.main import main
from harness.errors import UserError
from harness.measure.timing import Budget
from harness.results import store
from harness.results.documents import ENV, Manifest
from harness.results.record import Record
from harness.results.run_options import RunOptions
from harness.run import manifest_pairs, rundir
from harness.run.progress import RecordsTail
from harness.run.manifest_pairs import pair_manifest
from harness.run.rundir import MANIFEST, RunFolder, write_env
from harness.suite.cases import Case
from tests.run_folders import CASES, make_run
from tests.cli_runs import refused, write_suite


def test_force_refuses_to_delete_a_folder_no_run_wrote(tmp_path, capsys):
    suite = write_suite(tmp_path / "one.toml", ["naive"], [8])
    decoy = tmp_path / "out" / "decoy"
    decoy.mkdir(parents=True)
    (decoy / "thesis.tex").write_text("years of work")
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--run-id", "decoy", "--force", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refuses to delete" in err and "no manifest.json" in err
    assert (decoy / "thesis.tex").read_text() == "years of work"


def test_a_truncated_manifest_is_named_on_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MANIFEST).write_text('{"run_id": "run", "suite_arg": "qu')
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json: not valid JSON" in err


@pytest.mark.e2e
def test_a_run_records_what_its_backends_declare(tmp_path, capsys):
    suite = write_suite(tmp_path / "one.toml", ["naive", "sdpa-math", "projections"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "caps", "--quiet", "--no-check"]) == 0
    folder = RunFolder.open(tmp_path / "caps")
    caps = folder.manifest["capabilities"]
    assert caps["naive"]["materializes_scores"] and caps["naive"]["returns_weights"]
    assert caps["sdpa-math"]["baseline"] and not caps["naive"]["baseline"]
    assert not caps["projections"]["computes_attention"] and not caps["projections"]["attention_core"]
    assert json.loads((tmp_path / "caps" / MANIFEST).read_text())["run_id"] == "caps"


# -- the manifest holds the pairs, the budget and what measured them -----------------------------------------------------

def _created(tmp_path, cases, backends=("naive", "sdpa"), budget=None):
    """A run folder created as `attnbench run` creates one, from these pairs."""
    pairs = [(case, b) for case in cases for b in backends]
    manifest = {"run_id": "r", "suite": "gone", "suite_arg": "no_such_builtin_suite", "device": "cpu", "backends": list(backends),
                **pair_manifest(pairs),
                **RunOptions(budget=budget or Budget(warmup_s=0.003, measure_s=0.04, min_rounds=7, precision=0.02)).to_manifest()}
    folder = RunFolder.create(tmp_path / "r", manifest, force=False, suite_file=None)
    folder.unlock()
    return pairs


def test_the_manifest_holds_every_pair_as_data_and_the_budget_and_the_suite_is_never_loaded_again(tmp_path, monkeypatch):
    cases = [Case(B=2, S_q=5, S_kv=9, H=4, H_kv=2, d_k=16, d_v=8, dtype="bf16", causal=True, window=3, padding=True, seed=7, mode="bwd"),
             Case(B=1, S_q=1, S_kv=64, H=1, H_kv=1, d_k=576, d_v=512, mla=True)]
    budget = Budget(warmup_s=0.003, measure_s=0.04, min_rounds=7, precision=0.02)
    pairs = _created(tmp_path, cases, budget=budget)
    stored = json.loads((tmp_path / "r" / MANIFEST).read_text())
    # Every field of the dataclasses, whatever they become: a field added to Case or Budget travels without a change here.
    assert all(set(spec["case"]) == {f.name for f in dataclasses.fields(Case)} for spec in stored["pair_specs"])
    assert set(stored["budget"]) == {f.name for f in dataclasses.fields(Budget)}

    def no_suite(*args, **kwargs):
        raise AssertionError("the suite was loaded again")

    monkeypatch.setattr(manifest_pairs, "load_suite", no_suite)
    folder = RunFolder.open(tmp_path / "r")
    assert list(folder.pairs().values()) == pairs and list(folder.pairs()) == stored["pairs"]
    assert folder.budget == budget


def test_a_damaged_pair_in_the_manifest_is_refused_in_one_line_before_any_worker(tmp_path, capsys):
    _created(tmp_path, [Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=16, d_v=16)])
    path = tmp_path / "r" / MANIFEST
    stored = json.loads(path.read_text())
    stored["pair_specs"][1]["case"]["S_q"] = 16  # now another case than field 'pairs' names
    path.write_text(json.dumps(stored))
    refused(capsys, ["run", "--resume", str(tmp_path / "r"), "--quiet"], ["pair_specs[1]", "B1-Sq8-Skv8-H2-Hkv2-dk16-fp32-sdpa"])
    stored["pair_specs"][1]["case"]["S_q"], stored["budget"]["measure_s"] = 8, -1
    path.write_text(json.dumps(stored))
    refused(capsys, ["run", "--resume", str(tmp_path / "r"), "--quiet"], ["'budget'", "'measure_s'"])


def test_a_folder_made_before_manifests_held_their_pairs_is_rebuilt_from_its_suite_and_refused_once_it_changed(tmp_path, capsys):
    run = make_run(tmp_path / "old")  # its manifest lists pair keys only, as every run before this version did
    stored = json.loads((run / MANIFEST).read_text())
    assert "pair_specs" not in stored and "budget" not in stored
    folder = RunFolder.open(run)
    assert list(folder.pairs()) == stored["pairs"] and {c for c, _ in folder.pairs().values()} == set(CASES)
    assert folder.budget.measure_s == 0.01
    (run / "suite.toml").write_text((run / "suite.toml").read_text().replace("S = [16, 32]", "S = [64]"))
    err = refused(capsys, ["run", "--resume", str(run), "--quiet"], ["'pairs'", "did not record its pairs", "B1-Sq16"])
    assert "Traceback" not in err


# -- read once ---------------------------------------------------------------------------------------------------------

def test_recorded_with_repair_reads_the_records_file_once_and_builds_each_record_once(tmp_path, monkeypatch):
    run = make_run(tmp_path / "r")
    with open(run / "records.jsonl", "ab") as f:
        f.write(b'{"case_id": "B1-Sq16')  # a kill mid-write
    reads, builds = [], []
    real_read, real_build = store.open_regular, Record.from_dict.__func__
    monkeypatch.setattr(store, "open_regular", lambda *a, **k: reads.append(a[0]) or real_read(*a, **k))
    monkeypatch.setattr(Record, "from_dict", classmethod(lambda cls, *a, **k: builds.append(1) or real_build(cls, *a, **k)))
    records = RunFolder(run, Manifest(run_id="r")).recorded(repair=True)
    assert len(reads) == 1 and len(records) == len(builds) == 4
    assert (run / "records.jsonl").read_bytes().endswith(b"\n")  # the partial line is cut off
    builds.clear()
    assert len(store.load_run(run)) == 4 and len(builds) == 4


# -- the progress bar's count -------------------------------------------------------------------------------------------

def test_the_line_count_reads_only_what_was_appended_and_waits_for_a_whole_last_line(tmp_path):
    path = tmp_path / "records.jsonl"
    counter = RecordsTail(path)
    assert counter.count() == 0  # no file yet
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    assert counter.count() == 2
    with open(path, "r+b") as f:  # newlines written over what was already counted: a whole re-read would count them
        f.write(b"\n\n\n\n")
    with open(path, "ab") as f:
        f.write(b'{"c": ')
    assert counter.count() == 2  # the last line is not whole yet
    with open(path, "ab") as f:
        f.write(b'3}\n{"d": 4}\n')
    assert counter.count() == 4 and counter.offset == path.stat().st_size
    path.write_bytes(b'{"a": 1}\n')  # cut back (a repaired or replaced file): counted again from the start
    assert counter.count() == 1



def test_the_supervisor_learns_which_pairs_have_rows_from_the_appended_bytes_only(tmp_path, monkeypatch):
    """A worker's end asks which pairs have a row: the tail adds the keys of new whole lines, never re-reading the file."""
    run = make_run(tmp_path / "r")
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    (run / "records.jsonl").write_bytes(b"".join(lines[:2]))
    folder = RunFolder(run, Manifest(run_id="r"))
    built = []
    real_build = Record.from_dict.__func__
    monkeypatch.setattr(Record, "from_dict", classmethod(lambda cls, *a, **k: built.append(1) or real_build(cls, *a, **k)))
    assert folder.count_lines() == 2 and built == []  # the progress bar's poll counts newlines, parsing nothing beside the timed samples
    first = set(folder.recorded_keys())
    assert len(first) == 2 and len(built) == 2
    with open(run / "records.jsonl", "ab") as f:
        f.write(lines[2] + lines[3][:10])  # one more whole row, and one being written
    assert len(folder.recorded_keys()) == 3 and len(built) == 3  # only the new whole line was read and built
    with open(run / "records.jsonl", "ab") as f:
        f.write(lines[3][10:])
    assert folder.recorded_keys() == {r.pair_key for r in folder.recorded()} and len(built) == 4 + 4


def test_a_read_builds_each_distinct_case_once_and_every_row_holds_it(tmp_path):
    run = make_run(tmp_path / "r")
    records = store.read_records(run).typed()
    assert len(records) == 4 and len({id(r.case) for r in records}) == len({r.case for r in records}) == len(CASES)


# -- env.json: one writer ------------------------------------------------------------------------------------------------

def test_env_json_has_one_writer_that_types_it_first_and_replaces_it_whole(tmp_path):
    write_env(tmp_path, {"before": {"device_type": "cpu", "torch": "2.x"}, "telemetry_before": None})
    with pytest.raises(UserError, match="'before.device_name'"):
        write_env(tmp_path, {"before": {"device_name": ["a", "b"]}})  # never written: the reader would refuse it
    assert json.loads((tmp_path / ENV).read_text())["before"] == {"device_type": "cpu", "torch": "2.x"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [ENV]  # replaced whole: no temporary file is left
    assert rundir._is_run_file(f".{ENV}.123.tmp")  # one a kill leaves behind is a run's file, which --force may delete
