"""The run folder: --force deletes only a run's folder, a damaged manifest is named, capabilities are recorded."""

import json

from harness.cli.main import main
from harness.run.rundir import MANIFEST, RunFolder
from test_reliability import write_suite


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


def test_a_run_records_what_its_backends_declare(tmp_path, capsys):
    suite = write_suite(tmp_path / "one.toml", ["naive", "sdpa-math", "projections"], [8])
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "caps", "--quiet", "--no-check"]) == 0
    folder = RunFolder.open(tmp_path / "caps")
    caps = folder.manifest["capabilities"]
    assert caps["naive"]["materializes_scores"] and caps["naive"]["returns_weights"]
    assert caps["sdpa-math"]["baseline"] and not caps["naive"]["baseline"]
    assert not caps["projections"]["computes_attention"] and not caps["projections"]["attention_core"]
    assert json.loads((tmp_path / "caps" / MANIFEST).read_text())["run_id"] == "caps"
