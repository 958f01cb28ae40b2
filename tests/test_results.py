"""Records: JSONL append, CSV, and the round trip through pandas."""

import dataclasses
import json
import math
import re

import pandas as pd
import pytest

from harness.measure.timing import QUICK_BUDGET
from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.errors import UserError
from harness.results.record import COLUMNS, SCHEMA_VERSION, Record
from harness.results.store import RECORDS, RunWriter, load_run, read_records, write_csv
from harness.suite.cases import CASE_FIELDS
from harness.execution.execute import PairRunner, execute

CASE = Case(B=1, S_q=64, S_kv=64, H=4, H_kv=2, d_k=32, d_v=32, dtype="fp32", causal=True)


@pytest.fixture(scope="module")
def records():
    registry = load_registry()
    # Six samples whatever a call costs: on a busy machine one call may outlast the quick budget, never fewer calls here.
    runner = PairRunner(budget=dataclasses.replace(QUICK_BUDGET, fewest_rounds=None))
    return [execute(CASE, registry.get(name), runner, run_id="r1") for name in ("naive", "sdpa", "sdpa-cudnn")]


@pytest.mark.slow
def test_every_record_has_every_column(records):
    for record in records:
        assert set(COLUMNS) <= set(record.to_dict())
        assert record.schema_version == SCHEMA_VERSION
        assert record.case_id == CASE.id
        assert record.run_id == "r1"


def test_ok_and_unsupported_records(records):
    naive, sdpa, cudnn = records
    assert naive.status == "ok" and sdpa.status == "ok"
    assert cudnn.status == "unsupported" and "CUDA" in cudnn.reason
    assert naive.samples == len(naive.sample_ms) >= 5
    assert naive.latency_ms_min <= naive.latency_ms_median <= max(naive.sample_ms)
    # Throughput is derived from the registered formulas and the median, nothing else.
    assert naive.tflops == pytest.approx(naive.flops / (naive.latency_ms_median / 1e3) / 1e12)
    assert naive.gbps == pytest.approx(naive.bytes / (naive.latency_ms_median / 1e3) / 1e9)


def test_round_trip_through_jsonl_csv_and_pandas(tmp_path, records):
    writer = RunWriter(tmp_path)
    for record in records:
        writer.append(record)
    frame = load_run(tmp_path)
    assert list(frame.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert len(frame) == 3
    ok = frame[frame.status == "ok"]
    assert ok.latency_ms_median.tolist() == [r.latency_ms_median for r in records[:2]]  # full precision
    csv_path = write_csv(tmp_path)
    back = pd.read_csv(csv_path)
    assert len(back) == 3 and "sample_ms" not in back.columns
    assert back.latency_ms_median.iloc[0] == pytest.approx(records[0].latency_ms_median, rel=1e-15)
    assert back.status.tolist() == ["ok", "ok", "unsupported"]


def test_non_finite_numbers_are_stored_as_null(tmp_path, records):
    RunWriter(tmp_path).append(dataclasses.replace(records[0], tflops=math.inf, latency_ms_max=math.nan))
    line = json.loads((tmp_path / RECORDS).read_text())
    assert line["tflops"] is None and line["latency_ms_max"] is None


def test_a_record_survives_its_json_unchanged(records):
    for record in records:
        assert Record.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_the_record_carries_every_case_field_in_the_case_order():
    assert COLUMNS[1 : 1 + len(CASE_FIELDS)] == CASE_FIELDS


@pytest.mark.parametrize("field, value, words", [
    ("agree", "true", "'agree' has value 'true', expected true or false"),
    ("S_q", "many", "'S_q' has value 'many', expected an integer"),
    ("status", "fine", "'status' has value 'fine', expected one of ok, unsupported"),
    ("latency_ms_median", "fast", "'latency_ms_median' has value 'fast', expected a number"),
    ("B", None, "'B' is null"),
])
def test_a_record_of_the_wrong_type_is_named_not_coerced(records, field, value, words):
    data = {**records[0].to_dict(), field: value}
    with pytest.raises(UserError, match=re.escape(words)):
        Record.from_dict(data, where="runs/x/records.jsonl record 3")


def test_a_record_missing_a_case_field_is_named(records):
    data = records[0].to_dict()
    del data["S_q"]
    with pytest.raises(UserError, match="record 1: field 'S_q' is missing"):
        Record.from_dict(data, where="record 1")


def test_columns_a_newer_writer_added_are_kept(records):
    data = {**records[0].to_dict(), "profile_top_kernel": "aten::bmm"}
    assert Record.from_dict(data).to_dict()["profile_top_kernel"] == "aten::bmm"


def test_truncated_last_line_is_dropped_and_a_corrupt_line_is_named(tmp_path):
    path = tmp_path / RECORDS
    path.write_text('{"case_id": "a", "backend": "b", "status": "ok"}\n{"case_id": "c", "bac')
    result = read_records(path)
    assert len(result.records) == 1 and result.dropped_partial_line
    path.write_text('{"case_id": "a"}\nnot json\n{"case_id": "c"}\n')
    with pytest.raises(UserError, match=r"records.jsonl:2: corrupt record"):
        read_records(path)


def test_newer_schema_is_refused(tmp_path):
    (tmp_path / RECORDS).write_text(json.dumps({"case_id": "a", "schema_version": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(UserError, match="newer than this attnbench"):
        read_records(tmp_path)


def test_a_record_may_lack_only_the_case_fields_the_case_declares_added_later():
    """Which case fields an older record may lack is declared on the Case's fields (`added_later`), not kept in a hand list
    beside the store: each such field reads with its default, and any other missing field is refused naming it."""
    import dataclasses as dc

    from harness.results.store import record_problem
    from harness.suite.cases import CASE_FIELDS_ADDED
    from tests.synthetic_runs import synthetic_record

    later = {f.name for f in dc.fields(Case) if f.metadata.get("added_later")}
    assert set(CASE_FIELDS_ADDED) == later and {"softcap", "kv_dtype"} <= later
    full = synthetic_record(Case(B=1, S_q=8, S_kv=8, H=2, H_kv=2, d_k=8, d_v=8), "naive", 1.0).to_dict()
    older = {k: v for k, v in full.items() if k not in later}
    assert record_problem(older) is None
    assert Record.from_dict(older, where="older").case == Record.from_dict(full, where="full").case
    for name in ("dtype", "causal", "S_q"):
        assert f"no field {name!r}" in record_problem({k: v for k, v in full.items() if k != name})
