"""Issue 19, two classes: inputs that gave a traceback, and inputs that were silently accepted.

Every row of each table is a user's input run through `harness.cli.main.main` in-process: a refusal is
exit 2 with one line on stderr naming what is wrong, never a traceback; what used to crash must now
either answer (a report) or refuse in one line. The inputs differ from the issue's own examples on purpose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.run.protocol import machine_memory_bytes
from harness.suite.cases import Case
from tests.cli_runs import attnbench_in_process, refused
from tests.synthetic_runs import PEAKS, synthetic_record, write_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(backends=("naive", "sdpa-math")) -> list:
    records = []
    for S in (128, 256, 512):
        case = Case(B=1, S_q=S, S_kv=S, H=8, H_kv=8, d_k=64, d_v=64, dtype="fp32")
        for i, backend in enumerate(backends):
            records.append(synthetic_record(case, backend, S * S / 1e5 * (1 + i / 10), mem=10**6))
    return records


def _run(root: Path, name: str, records=None) -> Path:
    return write_run(root / name, records if records is not None else _records(), peaks=PEAKS)


def _edited(run: Path, edit) -> Path:
    """Rewrite the run's records.jsonl through `edit(row_number, row) -> row`."""
    path = run / "records.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(edit(i, row)) + "\n" for i, row in enumerate(rows, start=1)))
    return run


RECOMMEND = ("--seq", "256", "--B", "1", "--H", "8", "--H-kv", "8", "--d-k", "64", "--dtype", "fp32")

# -- tracebacks ------------------------------------------------------------------------------------

#: Latencies no measurement gives, written into a run's records: (label, edit, the field the refusal names).
BAD_LATENCIES = [
    ("every-median-0", lambda i, r: {**r, "latency_ms_median": 0.0, "latency_ms_p20": 0.0, "latency_ms_p80": 0.0}, "latency_ms_median"),
    ("every-latency-0", lambda i, r: {**r, **{k: 0 for k in r if k.startswith("latency_ms_")}, "sample_ms": [0.0, 0.0]}, "latency_ms_median"),
    ("one-median-0", lambda i, r: {**r, "latency_ms_median": 0} if i == 3 else r, "records.jsonl:3"),
    ("negative-median", lambda i, r: {**r, "latency_ms_median": -2.5} if i == 2 else r, "latency_ms_median"),
    ("negative-p20", lambda i, r: {**r, "latency_ms_p20": -0.1}, "latency_ms_p20"),
    ("negative-max", lambda i, r: {**r, "latency_ms_max": -1e-9} if i == 6 else r, "latency_ms_max"),
    ("negative-sample", lambda i, r: {**r, "sample_ms": [1.0, -1.0, 1.0]} if i == 1 else r, "sample_ms"),
    ("median-as-text-0", lambda i, r: {**r, "latency_ms_median": "0"} if i == 4 else r, "latency_ms_median"),
]


@pytest.mark.parametrize("edit, naming", [row[1:] for row in BAD_LATENCIES], ids=[row[0] for row in BAD_LATENCIES])
def test_impossible_latencies_are_refused_at_read_by_report_compare_and_recommend(tmp_path, capsys, edit, naming):
    good = _run(tmp_path, "good")
    bad = _edited(_run(tmp_path, "bad"), edit)
    refused(capsys, ["report", str(bad), "--out", str(tmp_path / "reports")], [naming])
    refused(capsys, ["compare", str(good), str(bad), "--out", str(tmp_path / "c.csv")], [naming])
    refused(capsys, ["compare", str(bad), str(good), "--out", str(tmp_path / "c.csv")], [naming])
    refused(capsys, ["recommend", str(bad), *RECOMMEND], [naming])


#: Backend names that mean something to matplotlib's mathtext.
MATHTEXT_NAMES = ["my$x^2$_{bad}", "cost$\\frac{1$", "a$^$b", "$_$", "two$$dollars", "$\\sqrt{$x", "lone$dollar", "{unbalanced_^"]


@pytest.mark.slow
def test_a_report_draws_backend_names_that_look_like_mathtext(tmp_path, capsys):
    run = _run(tmp_path, "mathtext", _records(backends=tuple(MATHTEXT_NAMES)))
    code, out, err = attnbench_in_process(["report", str(run), "--out", str(tmp_path / "reports")], capsys)
    assert code == 0, err
    html = Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text()
    assert html.count("data:image/png;base64,") >= 3  # the latency, memory and agreement figures were drawn


@pytest.mark.slow
def test_run_ids_that_look_like_mathtext_are_drawn_too(tmp_path, capsys):
    # Two runs: each run's measured peak is then labelled with its run id in the throughput figure.
    runs = [str(_run(tmp_path, name)) for name in ("run$\\frac{$", "b$^$")]
    code, _, err = attnbench_in_process(["report", *runs, "--out", str(tmp_path / "reports")], capsys)
    assert code == 0, err


#: (ATTNBENCH_BACKENDS entry, the name it is listed under, what its reason must say)
BAD_PLUGINS = [
    ("tests.bad_plugins:NameIsInt", "tests.bad_plugins:NameIsInt", "NameIsInt.name is 42, expected a non-empty string"),
    ("tests.bad_plugins:NameIsEmpty", "tests.bad_plugins:NameIsEmpty", "NameIsEmpty.name is ''"),
    ("tests.bad_plugins:NameIsNone", "tests.bad_plugins:NameIsNone", "NameIsNone.name is None"),
    ("tests.bad_plugins:NameIsTuple", "tests.bad_plugins:NameIsTuple", "NameIsTuple.name is ('a', 'b')"),
    ("tests.bad_plugins:FamilyIsInt", "tests.bad_plugins:FamilyIsInt", "FamilyIsInt.family is 3, expected a string"),
    ("tests.bad_plugins:FamilyIsNone", "tests.bad_plugins:FamilyIsNone", "FamilyIsNone.family is None"),
    ("tests.bad_plugins:VersionIsFloat", "plugin-version-float", "VersionIsFloat.version() returned 1.5, expected a string or None"),
    ("tests.bad_plugins:VersionIsBytes", "plugin-version-bytes", "version() returned b'1.0'"),
    ("tests.bad_plugins:VersionIsList", "plugin-version-list", "version() returned ['1', '2']"),
]


@pytest.mark.parametrize("spec, listed, reason", BAD_PLUGINS, ids=[row[0].split(":")[1] for row in BAD_PLUGINS])
def test_a_plugin_with_a_field_of_the_wrong_type_is_listed_unavailable(monkeypatch, capsys, spec, listed, reason):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", f"tests.bad_plugins:Fine,{spec}")
    code, out, err = attnbench_in_process(["backends", "--json"], capsys)
    assert code == 0 and "Traceback" not in err, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["plugin-ok"]["available"] is True
    assert rows[listed]["available"] is False and reason in rows[listed]["reason"], rows[listed]
    code, out, err = attnbench_in_process(["backends"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert any(line.startswith(listed) and "unavailable" in line and reason in line for line in out.splitlines()), out


@pytest.mark.e2e
def test_a_run_records_a_plugin_with_a_bad_version_as_unsupported_with_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", "tests.bad_plugins:VersionIsBytes")
    suite = tmp_path / "one.toml"
    suite.write_text('name = "one"\nbackends = ["plugin-version-bytes"]\n[[grid]]\nB = [1]\nS = [16]\nH = [2]\nH_kv = [2]\nd_k = [8]\ndtype = ["fp32"]\n')
    code, out, err = attnbench_in_process(["run", "--suite", str(suite), "--out", str(tmp_path / "results"), "--run-id", "r", "--quiet"],
                                          capsys)
    assert code == 0, err
    row = json.loads((tmp_path / "results" / "r" / "records.jsonl").read_text().splitlines()[0])
    assert row["status"] == "unsupported" and "version() returned b'1.0'" in row["reason"]


# -- silent acceptance -----------------------------------------------------------------------------

@pytest.mark.parametrize("code", ["none", "0", "3", "plugin refuses to load"])
def test_a_plugin_that_exits_at_import_is_listed_unavailable(monkeypatch, capsys, code):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", "tests.bad_plugins:Fine,tests.plugin_exits_at_import:add")
    monkeypatch.setenv("ATTNBENCH_TEST_EXIT", code)
    rc, out, err = attnbench_in_process(["backends"], capsys)
    assert rc == 0, err
    line = next(line for line in out.splitlines() if line.startswith("tests.plugin_exits_at_import:add"))
    assert "unavailable" in line and "SystemExit" in line
    assert any(line.startswith("plugin-ok") for line in out.splitlines())


@pytest.mark.parametrize("hook", ["exits_when_called", "exits_with_text"])
def test_a_plugin_hook_that_exits_is_listed_unavailable(monkeypatch, capsys, hook):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", f"tests.bad_plugins:{hook}")
    rc, out, err = attnbench_in_process(["backends"], capsys)
    assert rc == 0 and f"tests.bad_plugins:{hook}" in out and "SystemExit" in out, out + err


#: Budget values that are finite but no plan: (field, value).
HUGE_BUDGETS = [("measure_s", "1e308"), ("warmup_s", "1e308"), ("measure_s", "3601"), ("warmup_s", "86400"),
                ("min_sample_s", "1e300"), ("measure_s", "1.7976931348623157e308")]


@pytest.mark.parametrize("field, value", HUGE_BUDGETS, ids=[f"{f}={v}" for f, v in HUGE_BUDGETS])
def test_a_budget_beyond_the_ceiling_is_refused_naming_the_field(tmp_path, capsys, field, value):
    suite = tmp_path / "huge.toml"
    suite.write_text(f'name = "huge"\n[budget]\n{field} = {value}\n[[grid]]\nB = [1]\nS = [16]\nH = [2]\nH_kv = [2]\nd_k = [8]\ndtype = ["fp32"]\n')
    # --timeout bounds what accepting the budget would cost: every pair a timeout row, and exit 0.
    refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "results"), "--timeout", "3", "--quiet"], [field])
    refused(capsys, ["check", "--suite", str(suite)], [field])
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


@pytest.mark.parametrize("value", ["1e308", "3600.5", "1e6", "inf", "nan", "0", "-1"])
def test_stability_names_measure_s_when_it_is_out_of_range(capsys, value):
    refused(capsys, ["stability", "B1-Sq64-Skv64-H2-Hkv2-dk16-fp32", "--backend", "naive", "--measure-s", value], ["--measure-s"])


def _memory_limits() -> list[str]:
    total = machine_memory_bytes() or 2**40
    return ["100000000000000000000TiB", "1000000TiB", f"{2 * total}", f"{math.ceil(total / 2**30) + 1}GiB"]


@pytest.mark.parametrize("limit", _memory_limits())
def test_a_memory_limit_beyond_the_machine_is_refused(tmp_path, capsys, limit):
    refused(capsys, ["run", "--suite", "quick", "--out", str(tmp_path / "results"), "--memory-limit", limit], ["--memory-limit"])
    assert not (tmp_path / "results").exists()


#: Comma lists with a repeated or unknown item: (command line, what the refusal names).
BAD_LISTS = [
    (("run", "--suite", "quick", "--backends", "sdpa,naive,sdpa"), "sdpa given more than once"),
    (("run", "--suite", "quick", "--backends", "naive, naive"), "naive given more than once"),
    (("check", "--backends", "sdpa-math,sdpa-math"), "sdpa-math given more than once"),
    (("check", "--mode", "fwd,backward"), "unknown mode 'backward'"),
    (("check", "--mode", "FWD"), "unknown mode 'FWD'"),
    (("check", "--mode", "bwd,fwd,fwd_bwd,both"), "unknown mode 'both'"),
    (("check", "--mode", "bwd,bwd"), "bwd given more than once"),
    (("check", "--dtype", "fp32,fp8"), "unknown dtype 'fp8'"),
    (("check", "--dtype", "bf16,bfloat16"), "bf16 given more than once"),
    (("check", "--only", "Sq64,Sq64"), "Sq64 given more than once"),
]


@pytest.mark.parametrize("backends", ['["naive", "naive"]', '["sdpa", "naive", "sdpa", "naive"]'])
def test_a_suite_file_naming_a_backend_twice_is_refused(tmp_path, capsys, backends):
    suite = tmp_path / "twice.toml"
    suite.write_text(f'name = "twice"\nbackends = {backends}\n[[grid]]\nB = [1]\nS = [16]\nH = [2]\nH_kv = [2]\nd_k = [8]\ndtype = ["fp32"]\n')
    refused(capsys, ["run", "--suite", str(suite), "--out", str(tmp_path / "results"), "--timeout", "30", "--quiet"], ["more than once"])


@pytest.mark.parametrize("args, naming", BAD_LISTS, ids=[" ".join(a[1:]) for a, _ in BAD_LISTS])
def test_a_repeated_or_unknown_item_of_a_list_option_is_refused(tmp_path, capsys, args, naming):
    refused(capsys, args, [naming])


#: Edits that make a row's case_id contradict its own fields.
CONTRADICTIONS = [
    ("S_q", lambda r: {**r, "S_q": 2 * r["S_q"]}),
    ("dtype", lambda r: {**r, "dtype": "bf16"}),
    ("causal", lambda r: {**r, "causal": True}),
    ("window", lambda r: {**r, "window": 64}),
    ("H_kv", lambda r: {**r, "H_kv": 2}),
    ("id-edited", lambda r: {**r, "case_id": r["case_id"].replace("dk64", "dk128")}),
    ("id-garbage", lambda r: {**r, "case_id": "not-a-case"}),
]


@pytest.mark.parametrize("edit", [e for _, e in CONTRADICTIONS], ids=[n for n, _ in CONTRADICTIONS])
def test_a_row_whose_case_id_contradicts_its_fields_is_refused(tmp_path, capsys, edit):
    good = _run(tmp_path, "good")
    bad = _edited(_run(tmp_path, "bad"), lambda i, r: edit(r) if i == 2 else r)
    refused(capsys, ["report", str(bad), "--out", str(tmp_path / "reports")], ["records.jsonl:2"])
    refused(capsys, ["compare", str(good), str(bad), "--out", str(tmp_path / "c.csv")], ["case_id"])
    refused(capsys, ["recommend", str(bad), *RECOMMEND], ["case_id"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_run_that_measured_nothing_because_every_pair_failed_exits_1(tmp_path, capsys, monkeypatch):
    """Issue 19: a run whose every worker died (every pair crashed) exited 0; failures beside measured rows still exit 0."""
    from harness.backends.registry import ENV_VAR
    from tests.cli_runs import PLUGIN, TINY_BUDGET

    monkeypatch.setenv(ENV_VAR, PLUGIN)
    monkeypatch.setenv("ATTNBENCH_TEST_FAIL_S", "16")
    suite = tmp_path / "crash.toml"
    suite.write_text(f'name = "crash"\nbackends = ["t-segv"]\n{TINY_BUDGET}[[grid]]\nB = 1\nS = 16\nH = 2\nd_k = 16\n')
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "all-crashed", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("attnbench: no pair was measured (1 crashed)") and "Traceback" not in "\n".join(err)
    suite.write_text(f'name = "crash"\nbackends = ["t-segv", "naive"]\n{TINY_BUDGET}[[grid]]\nB = 1\nS = 16\nH = 2\nd_k = 16\n')
    assert main(["run", "--suite", str(suite), "--out", str(tmp_path), "--run-id", "one-crashed", "--quiet"]) == 0
