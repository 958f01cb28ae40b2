"""Results are never lost (issue 46): the results database, the site and the exports refuse what would replace, overwrite or
corrupt what a user keeps, and bad stored data is one line.

One table per class of bad input. Every input runs in process through the CLI (`harness.cli.main.main`), and each asserts
that nothing outside the output it names was written (every file under the test's folder, hashed before and after), that no
stored row was lost or changed (the database's tables, read raw), and that a refusal is one `attnbench: error:` line with exit
2, a valid-but-odd input exit 0 with a sane result. Classes 1-3 and 6 are here; stored data that is wrong (4) and sizes (5) in
tests/test_results_kept_data.py; the PostgreSQL concurrency table (7) in tests/test_history_postgres.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_runs import attnbench_in_process
from tests.history_runs import (changed, database_of, edit_json, records_of, refused_untouched, run_folder, stored, with_samples,
                                write_records)
from tests.run_folders import snapshot


# --- 1. a stored run replaced by a lesser copy --------------------------------------------------------------------------

def _drop_first_row(run):
    write_records(run, records_of(run)[1:])


def _swap_rows(run):
    r = records_of(run)
    write_records(run, [r[1], r[0], *r[2:]])


def _slower_row(run):
    r = records_of(run)
    r[2]["latency_ms_median"] *= 0.5
    write_records(run, r)


def _replace_a_row_and_append(run):
    r = records_of(run)
    write_records(run, [*r[:-1], r[0], r[-1]])  # a row inserted before the last: the stored rows are no longer its first ones


def _backends_edited(run):
    edit_json(run / "manifest.json", backends=["naive"])


def _other_env(run):
    edit_json(run / "env.json", before={"device_type": "cpu", "device_name": "another CPU", "torch": "2.y"})


def _no_records(run):
    (run / "records.jsonl").write_text("")


def _attempts_rewritten(run):
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-09T00:00:00Z", "wall_s": 9.0}])


LESSER_COPIES = {
    "the first row gone": _drop_first_row,
    "two rows swapped": _swap_rows,
    "a median halved by hand": _slower_row,
    "a row inserted before the last": _replace_a_row_and_append,
    "its manifest's backends edited": _backends_edited,
    "the same rows, another env.json": _other_env,
    "its records file emptied": _no_records,
    "an attempt the stored run never had, in place of its own": _attempts_rewritten,
}


@pytest.mark.parametrize("edit", LESSER_COPIES.values(), ids=LESSER_COPIES.keys())
def test_a_stored_run_is_not_replaced_by_a_copy_that_is_not_a_later_state_of_it(edit, tmp_path, capsys):
    """A folder of a stored run's uuid whose content is not the stored run plus appended rows: refused in one line offering
    --replace, the stored rows as they were; a new run given beside it is not added either."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0}])
    db = database_of(tmp_path, capsys, run)
    edit(run)
    other = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    refused_untouched(tmp_path, ["db", "add", other, run, "--db", db], capsys, "already holds run run-a", "not a later state",
                      "--replace", db=db)


def _resumed(run):
    r = records_of(run)
    write_records(run, [*r, {**r[0], "latency_ms_median": r[0]["latency_ms_median"] * 1.01}])
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0},
                                                {"started_utc": "2026-11-03T10:00:00Z", "wall_s": 1.0}])


def _resumed_with_nothing_left(run):
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0},
                                                {"started_utc": "2026-11-03T10:00:00Z", "wall_s": 0.2}])
    edit_json(run / "env.json", telemetry_after={"reason": "no GPU"})


LATER_STATES = {"resumed: a row and an attempt appended": (_resumed, 5, "updated run-a"),
                "resumed with nothing left to run: an attempt appended": (_resumed_with_nothing_left, 4, "updated run-a")}


@pytest.mark.parametrize("edit, rows, said", LATER_STATES.values(), ids=LATER_STATES.keys())
def test_a_later_state_of_a_stored_run_replaces_it(edit, rows, said, tmp_path, capsys):
    """What a resume leaves (rows and attempts appended, the stored ones unchanged): exit 0, the run's rows replaced, the stored
    ones kept as the first of them; nothing written but the database."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    edit_json(run / "manifest.json", attempts=[{"started_utc": "2026-11-01T10:00:00Z", "wall_s": 3.0}])
    db = database_of(tmp_path, capsys, run)
    _, old_rows = stored(db)
    edit(run)
    before = snapshot(tmp_path)
    ran = attnbench_in_process(["db", "add", run, "--db", db], capsys)
    assert ran.code == 0 and ran.out.startswith(said), ran
    assert changed(before, snapshot(tmp_path), db.name) == []
    _, new_rows = stored(db)
    assert len(new_rows) == rows and new_rows[:len(old_rows)] == old_rows


def test_replace_is_the_explicit_way_to_store_an_earlier_copy(tmp_path, capsys):
    """--replace stores the copy given, whatever it is, and says so."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    _drop_first_row(run)
    ran = attnbench_in_process(["db", "add", run, "--db", db, "--replace"], capsys)
    assert ran.code == 0 and ran.out.startswith("replaced run-a") and "--replace" in ran.out, ran
    assert len(stored(db)[1]) == 3


# --- 2. outputs written where the user did not ask ------------------------------------------------------------------------

def _user_folder(tmp, run):
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.md").write_text("my notes\n")
    return ["site", "--out", tmp / "mine"], ("exists and is not a site",)


def _inside_run(tmp, run):
    return ["site", "--out", run / "site"], ("inside the run folder",)


def _the_run_itself(tmp, run):
    return ["site", "--out", run], ("inside the run folder",)


def _a_file(tmp, run):
    (tmp / "site.tar").write_bytes(b"not a folder")
    return ["site", "--out", tmp / "site.tar"], ("not a plain folder",)


def _under_a_file(tmp, run):
    (tmp / "plain").write_text("x")
    return ["site", "--out", tmp / "plain" / "site"], ("cannot write",)


def _a_link(tmp, run):
    (tmp / "real").mkdir()
    (tmp / "linked").symlink_to(tmp / "real")
    return ["site", "--out", tmp / "linked"], ("not a plain folder",)


def _site_with_a_user_file(tmp, run):
    site = tmp / "old-site"
    site.mkdir()
    (site / "index.html").write_text("<!DOCTYPE html><html><head><title>attnbench site</title></head></html>")
    (site / "budget.xlsx").write_bytes(b"kept")
    return ["site", "--out", site], ("exists and is not a site",)


def _missing_db(tmp, run):
    return ["site", "--db", tmp / "nowhere.sqlite", "--out", tmp / "fresh"], ("no results database at",)


def _db_inside_out(tmp, run):
    site = tmp / "old-site"
    (site / "csv").mkdir(parents=True)
    (site / "index.html").write_text("<!DOCTYPE html><html><head><title>attnbench site</title></head></html>")
    os.replace(tmp / "team.sqlite", site / "csv" / "team.sqlite")  # the team's database, kept in the site it publishes
    return ["site", "--out", site, "--db", site / "csv" / "team.sqlite"], ("lies inside --out",)


def _db_add_in_run(tmp, run):
    return ["db", "add", run, "--db", run / "kept.sqlite"], ("inside the run folder",)


def _db_add_below_run(tmp, run):
    return ["db", "add", run, "--db", run / "deeper" / "kept.sqlite"], ("inside the run folder",)


def _export_in_run(tmp, run):
    return ["export", run, "--format", "flashinfer-bench", "--out", run / "sub" / "traces.jsonl"], ("inside the run folder",)


UNASKED = {"site into a user's folder": _user_folder, "site into a run folder": _inside_run, "site as a run folder": _the_run_itself,
           "site onto a file": _a_file, "site under a file": _under_a_file, "site through a symbolic link": _a_link,
           "site over an earlier site holding a user's file": _site_with_a_user_file, "site of a missing database": _missing_db,
           "site over the folder holding its database": _db_inside_out, "db add into a run folder": _db_add_in_run,
           "db add below a run folder": _db_add_below_run, "export below a run folder": _export_in_run}


@pytest.mark.parametrize("case", UNASKED.values(), ids=UNASKED.keys())
def test_nothing_is_written_where_the_user_did_not_ask(case, tmp_path, capsys):
    """Every command that writes follows one rule: never into a run folder, never over what is not its own, never through a
    link, a missing input is an error; each refused in one line with the tree and the database as they were."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    argv, words = case(tmp_path, run)
    if argv[0] == "site" and "--db" not in argv:
        argv += ["--db", db]
    named = Path(argv[argv.index("--db") + 1]) if "--db" in argv else db
    refused_untouched(tmp_path, argv, capsys, *words, db=named if named.exists() else None)


@pytest.mark.slow
def test_a_site_replaces_an_earlier_site_and_nothing_else(tmp_path, capsys):
    """An empty folder, then the site written there before: exit 0, only that folder changed, no temporary folder left."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    (tmp_path / "site").mkdir()
    for _ in range(2):
        before = snapshot(tmp_path)
        ran = attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys)
        assert ran.code == 0 and "site written" in ran.out, ran
        assert changed(before, snapshot(tmp_path), "site") == []
        assert (tmp_path / "site" / "index.html").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run-a", "site", "team.sqlite"]


# --- 3. a write that goes through a link -----------------------------------------------------------------------------------

def _export_over_a_manifest_link(tmp, run, other):
    with_samples(run)
    os.link(other / "manifest.json", tmp / "out.json")
    return ["export", run, "--format", "pytest-benchmark", "--out", tmp / "out.json", "--force"], other / "manifest.json"


def _export_over_a_user_file_link(tmp, run, other):
    (tmp / "keep").mkdir()
    (tmp / "keep" / "traces.jsonl").write_text('{"mine": true}\n')
    os.link(tmp / "keep" / "traces.jsonl", tmp / "traces.jsonl")
    return ["export", run, "--format", "flashinfer-bench", "--out", tmp / "traces.jsonl", "--force"], tmp / "keep" / "traces.jsonl"


def _compare_over_a_linked_comparison(tmp, run, other):
    (tmp / "archive").mkdir()
    (tmp / "archive" / "old.csv").write_text("case_id,backend,status_base,status_new,x\n")
    os.link(tmp / "archive" / "old.csv", tmp / "cmp.csv")
    return ["compare", run, other, "--out", tmp / "cmp.csv"], tmp / "archive" / "old.csv"


def _report_over_a_linked_page(tmp, run, other):
    ran = ["report", run, "--out", tmp / "reports"]
    from harness.cli.main import main

    assert main([str(a) for a in ran]) == 0
    (tmp / "kept.html").unlink(missing_ok=True)
    os.link(tmp / "reports" / "run-a" / "index.html", tmp / "kept.html")
    return ran, tmp / "kept.html"


LINKED = {"export --force over a hard link to another run's manifest": _export_over_a_manifest_link,
          "export --force over a hard link to a user's file": _export_over_a_user_file_link,
          "compare over a hard link to an archived comparison": _compare_over_a_linked_comparison,
          "report over a page hard-linked elsewhere": pytest.param(_report_over_a_linked_page, marks=pytest.mark.slow)}


@pytest.mark.parametrize("case", LINKED.values(), ids=LINKED.keys())
def test_an_output_never_changes_another_name_of_the_file_it_replaces(case, tmp_path, capsys):
    """An output that is a hard link to another file: written beside it and renamed over it, so the other name keeps its bytes."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    other = run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00")
    argv, other_name = case(tmp_path, run, other)
    capsys.readouterr()
    kept = other_name.read_bytes()
    before = snapshot(tmp_path)
    ran = attnbench_in_process(argv, capsys)
    assert ran.code in (0, 3), ran  # compare of two equal runs judges nothing: 3, its CSV written all the same
    assert other_name.read_bytes() == kept
    outputs = {str(Path(a).relative_to(tmp_path)) for a in argv[argv.index("--out") + 1:argv.index("--out") + 2]}
    assert changed(before, snapshot(tmp_path), *outputs) == []
    assert not [p for p in tmp_path.rglob(".*.tmp")]


# --- 6. names that are markup --------------------------------------------------------------------------------------------

MARKUP_NAMES = {"an unclosed fraction": r"flash$\frac{1}{$", "an unknown command": r"my$\nokernel$", "a lone superscript": "x$^$",
                "two dollars around text": "cost$ 5 and 6$"}


@pytest.mark.slow
@pytest.mark.parametrize("name", MARKUP_NAMES.values(), ids=MARKUP_NAMES.keys())
def test_a_backend_named_with_mathtext_is_drawn_as_written(name, tmp_path, capsys):
    """A plugin backend whose name matplotlib would read as mathtext: the site is written whole (exit 0), the name shown as
    written; nothing outside the site changes."""
    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    write_records(run, [{**r, "backend": name} if r["backend"] == "sdpa-math" else r for r in records_of(run)])
    edit_json(run / "manifest.json", backends=["naive", name])
    db = database_of(tmp_path, capsys, run)
    before = snapshot(tmp_path)
    ran = attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys)
    assert ran.code == 0 and ran.err == "", ran
    assert changed(before, snapshot(tmp_path), "site") == []
    from harness.report.page import esc

    trend = next((tmp_path / "site" / "trends").glob("*.html")).read_text()
    assert esc(name) in trend and "no report:" not in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.slow
def test_a_site_that_fails_midway_leaves_the_earlier_one_whole(tmp_path, capsys, monkeypatch):
    """A failure late in a build (here: its CSVs cannot be written), after a run was added: the earlier site's bytes as they
    were (no page of the new build in it), no half-built folder left beside it."""
    import harness.history.site as site

    run = run_folder(tmp_path / "run-a", "a", "2026-11-01T10:00:00+00:00")
    db = database_of(tmp_path, capsys, run)
    assert attnbench_in_process(["site", "--db", db, "--out", tmp_path / "site"], capsys).code == 0
    database_of(tmp_path, capsys, run_folder(tmp_path / "run-b", "b", "2026-11-02T10:00:00+00:00", slower={"naive": 1.5}))
    before = snapshot(tmp_path)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(site, "_csv", broken)
    with pytest.raises(Exception, match="No space left on device"):
        site.build_site(*_frames(db), tmp_path / "site")
    assert changed(before, snapshot(tmp_path)) == []


def _frames(db: Path):
    from harness.history.database import open_database

    with open_database(db, create=False) as opened:
        return opened.runs_frame(), opened.rows_frame()
