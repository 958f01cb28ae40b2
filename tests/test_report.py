"""The HTML report: complete, escaped, self-contained, and opened in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.suite.cases import Case
from harness.cli.main import main
from harness.report import build_report
from tests.browser import browse, chromium
from tests.synthetic_runs import PEAKS, synthetic_record, write_run
from tests.h200_data import H200, needs_h200

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
EVIL = "<script>alert(1)</script>"
SECTIONS = ("overview", "choose", "policy", "latency", "flags", "state", "roofline", "crossover", "scaling", "memory", "profiling", "agreement", "failures", "runtime", "environment", "files")


def _records() -> list[dict]:
    """Two dtypes, two batch sizes, MHA and GQA, S 128–1024, the projections, a bad backend name, failures and a wrong row."""
    records = []
    for dtype in ("fp32", "bf16"):
        for B in (1, 2):
            for H_kv in (8, 2):
                for S in (128, 256, 512, 1024):
                    case = Case(B=B, S_q=S, S_kv=S, H=8, H_kv=H_kv, d_k=64, d_v=64, dtype=dtype)
                    size = 4 if dtype == "fp32" else 2
                    records.append(synthetic_record(case, "projections", B * S / 400, agree=None, family="layer", flops=8 * B * S * 512**2))
                    records.append(synthetic_record(case, "naive", B * S * S / 1e5 + 0.01, mem=2 * B * 8 * S * S * size, family="eager"))
                    records.append(synthetic_record(case, "sdpa-math", B * S * S / 0.8e5 + 0.02, mem=2 * B * 8 * S * S * size))
                    records.append(synthetic_record(case, EVIL, B * S * S / 2e5 + 0.005, mem=B * 8 * S * 64 * size))
                    records.append(synthetic_record(case, "too-good", B * S * S / 1e9, agree=False, mem=B * 8 * S * 64 * size))
                    records.append(synthetic_record(case, "gpu-only", 0.0, status="unsupported"))
    return records


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    run = write_run(root / "results" / "synthetic", _records(), peaks=PEAKS,
                    env={"before": {"device_type": "cpu", "device_name": f"CPU {EVIL}", "torch": "2.x"}, "telemetry_before": None})
    return build_report([run], out_root=root / "reports")


@pytest.mark.slow
def test_report_has_every_section_and_its_csvs(report):
    html = report.read_text()
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in html
    assert report.parent.name == "synthetic" and report.name == "index.html"
    records = pd.read_csv(report.parent / "records.csv")
    assert len(records) == len(_records()) and {"pct_peak_flops", "pct_peak_bw", "bound", "impossible"} <= set(records.columns)
    for name in ("winners.csv", "speedup_vs_baseline.csv", "latency_ms.csv", "roofline.csv", "crossover.csv", "scaling.csv", "memory_model.csv", "failures.csv"):
        assert (report.parent / name).exists(), name
        assert f'href="{name}"' in html
    crossover = pd.read_csv(report.parent / "crossover.csv")
    assert set(crossover["D"]) == {512} and (crossover["model_S_star"] == 512 * (1 + crossover["H_kv"] / 8)).all()
    winners = pd.read_csv(report.parent / "winners.csv")
    assert set(winners["winner"]) == {EVIL}  # too-good is faster but disagrees: never a winner


def test_report_flags_impossible_rows(report):
    # too-good runs at up to thousands of TFLOP/s against a 1 TFLOP/s peak: flagged, not celebrated.
    html = report.read_text()
    assert "IMPOSSIBLE" in html and "impossible" in html
    roof = pd.read_csv(report.parent / "roofline.csv")
    assert roof.loc[roof["backend"] == "too-good", "impossible"].all()
    assert not roof.loc[roof["backend"] == "projections", "impossible"].any()


def test_data_strings_are_escaped(report):
    html = report.read_text()
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_is_self_contained(report):
    html = report.read_text()
    for attr, value in re.findall(r'\b(src|href)="([^"]*)"', html):
        if attr == "src":
            assert value.startswith("data:image/png;base64,"), value[:60]
        else:
            assert value.startswith("#") or (report.parent / value).is_file(), value
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|<link\b|<iframe\b", html.split("<body>", 1)[1].replace("http://www.w3.org", ""))


# -- a real browser ---------------------------------------------------------------------------------
@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (CI installs the Debian package `chromium`; see .ci/run)")
def test_report_in_headless_chromium(report, tmp_path):
    found, console = browse(report, tmp_path)
    assert found["errors"] == [] and console == ""
    assert found["images"] >= 6 and found["zero_width"] == 0
    assert found["tables"] >= 8 and tuple(found["sections"]) == SECTIONS
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile2'}",
                    "--window-size=1400,5000", f"--screenshot={shot}", report.resolve().as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (CI installs the Debian package `chromium`; see .ci/run)")
def test_the_browser_probe_sees_a_broken_image(tmp_path):
    # The probe must be able to fail: an undecodable image and a console error are caught.
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head></head><body><img src="data:image/png;base64,AAAA"><table></table>'
                    '<section id="x"></section></body></html>')
    found, _ = browse(page, tmp_path)
    assert found["images"] == 1 and found["zero_width"] == 1 and found["errors"]


# -- end to end -------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_run_with_report_ends_with_the_report_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    suite = ROOT / "suites" / "example.toml"
    code = main(["run", "--suite", str(suite), "--out", "results", "--run-id", "e2e", "--quiet", "--report",
                 "--only", "B1-Sq256-Skv256-H8-Hkv8-dk64-fp32-sdpa-math"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"report: {Path('reports') / 'e2e' / 'index.html'}"
    assert (tmp_path / "reports" / "e2e" / "index.html").exists()
    peaks = json.loads((tmp_path / "results" / "e2e" / "peaks.json").read_text())
    assert peaks["matmul"]["fp32"]["tflops"] > 0 and peaks["copy"]["gbps"] > 0
    roof = pd.read_csv(tmp_path / "reports" / "e2e" / "roofline.csv")
    assert roof["pct_peak_flops"].notna().all() and set(roof["bound"]) <= {"compute", "memory"}


def test_environment_shows_clocks_before_and_after_with_throttling_changes_marked():
    from harness.report.telemetry import telemetry_html

    before = [{"index": 0, "name": "GPU <i>", "sm_clock_mhz": 1980, "throttle_reasons_hex": "0x0"}]
    after = [{"index": 0, "name": "GPU <i>", "sm_clock_mhz": 1755, "throttle_reasons_hex": "0x4"}]
    html = telemetry_html(before, after)
    assert "GPU &lt;i&gt;" in html and "1,980" in html and "1,755" in html
    assert '<td class="bad t">0x4 (SW power cap)</td>' in html
    assert "not recorded" in telemetry_html(None, None)
    assert "pynvml) is not installed" in telemetry_html({"unavailable": "nvidia-ml-py (pynvml) is not installed"}, None)


@needs_h200
def test_an_idle_gpu_before_the_sweep_is_not_called_throttled():
    from harness.report.telemetry import telemetry_html

    env = json.loads((H200 / "env.json").read_text())
    assert env["telemetry_before"][0]["throttle_reasons_hex"] == "0x1" and env["telemetry_after"][0]["throttle_reasons_hex"] == "0x0"
    html = telemetry_html(env["telemetry_before"], env["telemetry_after"])
    assert "0x1 (GPU idle)" in html and "0x0 (none)" in html
    assert 'class="bad' not in html


def test_a_thermal_slowdown_is_called_throttled_whatever_else_is_set():
    from harness.report.telemetry import telemetry_html

    before = [{"index": 0, "throttle_reasons": 1, "throttle_reasons_hex": "0x1"}]
    after = [{"index": 0, "throttle_reasons": 0x41, "throttle_reasons_hex": "0x41"}]
    html = telemetry_html(before, after)
    assert '<td class="bad t">0x41 (GPU idle, HW thermal slowdown)</td>' in html
    assert html.count('class="bad') == 1  # the idle GPU before the run is not


@pytest.mark.slow
def test_the_report_says_when_the_run_was_contended(tmp_path):
    quiet = [_records()[1]]
    busy = synthetic_record(Case(B=1, S_q=128, S_kv=128, H=8, H_kv=8, d_k=64, d_v=64), "sdpa-math", 8.0)
    busy.contended, busy.run_queue_wait_ratio = True, 0.6
    page = build_report([write_run(tmp_path / "results" / "busy", [*quiet, busy], peaks=PEAKS)], out_root=tmp_path / "reports")
    html = page.read_text()
    assert "1 measured row left out of every winner, recommendation, speed-up, fit and crossover on this page: 1 contended" in html
    calm = build_report([write_run(tmp_path / "results" / "calm", quiet, peaks=PEAKS)], out_root=tmp_path / "reports")
    assert "contended" not in calm.read_text().split('<section id="choose">')[0]


@pytest.mark.slow
def test_rows_flagged_too_short_or_launch_leaked_are_listed_with_what_the_flags_mean(tmp_path):
    decode = Case(B=1, S_q=1, S_kv=4096, H=32, H_kv=8, d_k=128, d_v=128, dtype="bf16", device="cuda")
    short = synthetic_record(decode, "sdpa-flash", 0.004)
    short.too_short, short.launch_leaked, short.latency_ms_min, short.samples, short.clock_resolution_s = True, 0, 0.0039, 200, 5e-7
    leaky = synthetic_record(decode, "sdpa-cudnn", 0.0165)
    leaky.too_short, leaky.launch_leaked, leaky.samples, leaky.clock_resolution_s = False, 37, 200, 3.2e-8
    clean = synthetic_record(decode, "sdpa", 0.0127)
    clean.too_short, clean.launch_leaked = False, 0
    page = build_report([write_run(tmp_path / "results" / "flags", [short, leaky, clean], peaks=PEAKS)], out_root=tmp_path / "reports")
    html = page.read_text()
    section = html.split('<section id="flags">')[1].split("</section>")[0]
    assert "quantisation alone may move a sample by more than 1 %" in section and "may hold host launch time" in section
    assert "2 of 3 measured rows carry a flag" in section and "sdpa-flash" in section and "sdpa-cudnn" in section
    assert ">sdpa<" not in section  # the row with neither flag is not listed
    assert "2 of 3 measured rows carry a sample flag (1 too short for the clock&#x27;s tick, 1 with launch-leaked samples)" in html
    flagged = pd.read_csv(page.parent / "sample_flags.csv")
    assert flagged[["backend", "too_short", "launch_leaked"]].values.tolist() == [["sdpa-flash", True, 0], ["sdpa-cudnn", False, 37]]
    calm = build_report([write_run(tmp_path / "results" / "calm", [clean], peaks=PEAKS)], out_root=tmp_path / "reports")
    assert "No measured row carries a flag, contended and suspect included (1 checked)" in calm.read_text() and not (calm.parent / "sample_flags.csv").exists()


def test_the_run_time_section_counts_what_stopped_each_rows_sampling():
    from harness.report.runtime import sampling_summary

    frame = pd.DataFrame({
        "status": ["ok", "ok", "ok", "unsupported"],
        "stopped_by": ["precision", "budget", "budget", None],
        "latency_ms_median": [1.0, 2.0, 3.0, None],
        "latency_ms_ci95_low": [0.995, 1.9, 2.98, None],
        "latency_ms_ci95_high": [1.004, 2.1, 3.02, None],
    })
    text = sampling_summary(frame)
    assert "the 3 ok rows" in text and "1 once the median's 95 % interval was within ±1 % on a steady run" in text and "2 at the time budget" in text
    assert "2 of them have their median's 95 % interval within ±1 %" in text  # 1.0 ± 0.5 % and 3.0 ± 0.7 %; 2.0 ± 5 % is not
    assert sampling_summary(frame.drop(columns="stopped_by")) is None  # records from before the column: nothing claimed


@pytest.mark.e2e
def test_importing_and_drawing_the_report_leaves_matplotlibs_backend_and_rcparams_alone(tmp_path):
    # A fresh interpreter whose backend is set (svg, as a GUI program's would be): the report must draw on its own canvas.
    script = (
        "import sys, matplotlib\n"
        "backend, params = matplotlib.get_backend(), dict(matplotlib.rcParams)\n"
        "import harness.report, harness.report.figures as figs\n"
        "fig, axes = figs.panels(3)\n"
        "axes[0].plot([1, 2], [1, 2])\n"
        "assert figs.to_data_uri(fig).startswith('data:image/png;base64,')\n"
        "assert matplotlib.get_backend() == backend, (backend, matplotlib.get_backend())\n"
        "changed = sorted(k for k, v in matplotlib.rcParams.items() if params.get(k) != v and k != 'backend')\n"
        "assert not changed, changed\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
    )
    env = {**os.environ, "MPLBACKEND": "svg", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.e2e
def test_the_report_reads_rows_without_importing_torch(tmp_path):
    """Reading rows needs no tensor library: `attnbench report` of a run that recorded its backends' capabilities leaves
    torch unimported (seconds of a report's CPU time; a run without them loads the registry, and torch with it)."""
    records = _records()
    declared = {b: {"computes_attention": True, "attention_core": True, "materializes_scores": b == "naive", "baseline": b == "naive",
                    "returns_weights": False} for b in {r.backend for r in records}}
    run = write_run(tmp_path / "results" / "synthetic", records, peaks=PEAKS, capabilities=declared)
    script = ("import sys; from harness.cli.main import main; "
              f"code = main(['report', {str(run)!r}, '--out', {str(tmp_path / 'reports')!r}]); "
              "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout
