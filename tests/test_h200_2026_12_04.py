"""The analysis replayed on the rows one H200 measured on 2026-12-04 (tests/data/h200-2026-12-04, committed, so these run
everywhere): the crossover found where the measured times cross, and the report's GPU sections built from real GPU rows."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from harness.analysis import crossovers, load

DATA = Path(__file__).resolve().parent / "data" / "h200-2026-12-04"


def h200_run(folder: Path, slice_number: int = 1) -> Path:
    """A run folder of the committed slice `slice_number`: its records, with the run's env.json and peaks.json."""
    run = folder / f"h200-slice-{slice_number}"
    run.mkdir(parents=True)
    with gzip.open(DATA / f"slice-{slice_number}.records.jsonl.gz", "rt") as rows:
        (run / "records.jsonl").write_text(rows.read())
    for name in ("env.json", "peaks.json"):
        shutil.copy(DATA / name, run / name)
    return run


@pytest.fixture(scope="module")
def slice_frame(tmp_path_factory):
    return load([h200_run(tmp_path_factory.mktemp("h200"))]).frame


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-flash", "naive"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_crossover_lies_between_the_measured_lengths_where_the_core_overtakes_the_projections(slice_frame, backend, causal):
    # The bracket from the raw medians alone: the last S where the core is cheaper than the projections, and the next one.
    ok = slice_frame[(slice_frame["status"] == "ok") & (slice_frame["causal"] == causal)]
    core = ok[ok["backend"] == backend].set_index("S_q")["latency_ms_median"].sort_index()
    projections = ok[ok["backend"] == "projections"].set_index("S_q")["latency_ms_median"].sort_index()
    cheaper = [S for S in core.index if core[S] < projections[S]]
    dearer = [S for S in core.index if core[S] >= projections[S]]
    found = crossovers(slice_frame)
    row = found[(found["backend"] == backend) & (found["causal"] == causal)].iloc[0]
    if not cheaper:  # naive, causal: dearer already at the smallest S, and the table says so rather than inventing a point
        assert row["S_star_text"].startswith("<") and row["S_min"] == min(core.index)
        return
    low, high = max(cheaper), min(S for S in dearer if S > max(cheaper))
    assert low < row["S_star"] < high, (backend, causal, low, row["S_star"], high)
    assert float(row["S_star_over_D"]) == pytest.approx(row["S_star"] / 4096, abs=0.01)  # D = H × d_k = 32 × 128


@pytest.mark.e2e
def test_the_report_of_the_real_run_has_its_gpu_sections_and_ceilings(tmp_path, capsys):
    from tests.cli_runs import attnbench_in_process

    run = h200_run(tmp_path / "results")
    ran = attnbench_in_process(["report", str(run), "--out", str(tmp_path / "reports")], capsys)
    assert ran.code == 0, ran.err
    folder = tmp_path / "reports" / run.name
    page = (folder / "index.html").read_text()
    for section in ("state", "roofline", "crossover", "scaling", "choose"):
        assert f'<section id="{section}">' in page, section
    peaks = (folder / "peaks.csv").read_text()
    assert "matmul bf16" in peaks and "copy" in peaks
    # The run's own measured ceiling, as peaks.json holds it, is the roofline's yardstick.
    measured = json.loads((DATA / "peaks.json").read_text())["matmul"]["bf16"]["tflops"]
    assert f"{measured}"[:6] in peaks
