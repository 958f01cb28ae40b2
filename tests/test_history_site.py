"""`attnbench site`: two tiny real run folders, a 30 %-slower backend in the second, built into a static site."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.history.ingest import read_run
from harness.history.site import build_site
from tests.browser import browse, chromium
from tests.run_folders import make_run


def _run(path, ms, uuid, created):
    make_run(path, ms=ms)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(run_uuid=uuid, created_utc=created)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return read_run(path)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("site")
    first = _run(tmp / "run-a", 1.0, "a" * 32, "2026-11-01T00:00:00+00:00")
    second = _run(tmp / "run-b", 1.3, "b" * 32, "2026-11-02T00:00:00+00:00")
    runs = pd.DataFrame([first.run, second.run])
    rows = pd.DataFrame(first.rows + second.rows)
    return build_site(runs, rows, tmp / "out"), rows


@pytest.mark.slow
def test_site_holds_both_runs_trends_changes_winners_and_csvs(site):
    index, rows = site
    html = index.read_text()
    assert "run-a" in html and "run-b" in html
    for name in ("run-a", "run-b"):
        assert (index.parent / "runs" / name / "index.html").is_file()
        assert f'href="runs/{name}/index.html"' in html
    trend = next((index.parent / "trends").glob("*.html")).read_text()
    for case in set(rows["case_id"]):
        assert case in trend
    assert "slower 1.30× at run run-b" in trend
    assert "Latest winners" in trend
    csvs = sorted((index.parent / "csv").rglob("*.csv"))
    assert len(csvs) == 2
    for path in csvs:
        frame = pd.read_csv(path)
        assert "record_json" not in frame.columns and len(frame) > 0


@pytest.mark.browser
def test_site_opens_in_chromium(site, tmp_path):
    if chromium() is None:
        pytest.skip("no headless Chromium on this machine")
    index, _ = site
    for path in [index, *(index.parent / "trends").glob("*.html")]:
        found, log = browse(path, tmp_path)
        assert not found["errors"], log
        assert not found["zero_width"]


@pytest.mark.slow
def test_contended_rows_are_no_change_and_a_bad_run_is_listed_without_a_link(tmp_path):
    first = _run(tmp_path / "run-a", 1.0, "a" * 32, "2026-11-01T00:00:00+00:00")
    second = _run(tmp_path / "run-b", 1.3, "b" * 32, "2026-11-02T00:00:00+00:00")
    runs = pd.DataFrame([first.run, second.run])
    runs.loc[1, "manifest_json"] = "{not json"
    rows = pd.DataFrame(first.rows + second.rows)
    rows.loc[rows["run_uuid"] == "b" * 32, "contended"] = True
    index = build_site(runs, rows, tmp_path / "out")
    html = index.read_text()
    assert "no report:" in html and 'href="runs/run-b/index.html"' not in html
    assert 'href="runs/run-a/index.html"' in html
    trend = next((index.parent / "trends").glob("*.html")).read_text()
    assert "slower" not in trend


def test_a_backend_that_ran_alone_is_no_latest_winner():
    from harness.history.site import _winners

    def row(case, backend, ms, **flags):
        return {"case_id": case, "backend": backend, "latency_ms_median": ms, "status": "ok", "agree": True, "run_uuid": "u",
                "run_id": "r", "created_utc": "2026-12-03T00:00:00+00:00", "contended": False, "suspect": False, **flags}

    rows = pd.DataFrame([row("sinks", "naive", 0.6), row("sinks", "sdpa", 0.2, contended=True),  # the faster one is flagged
                         row("plain", "naive", 0.6), row("plain", "sdpa", 0.2)])
    table = {cells[0]: cells[1] for cells in _winners(pd.DataFrame(), rows)}
    assert table["plain"] == "sdpa"
    assert table["sinks"].startswith("only candidate: naive") and "not a win" in table["sinks"]
