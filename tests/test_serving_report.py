"""The report's serving views (packed against padded, paged decode bandwidth, the winner per batch) and `recommend --batch`."""

from __future__ import annotations

import zlib

import pandas as pd
import pytest

from harness.analysis import serving
from harness.attention import theory
from harness.cli.main import main
from harness.report import build_report
from harness.report.figures import backend_colors
from harness.report.serving import serving_sections
from harness.results.record import Record
from harness.suite.cases import Case
from tests.synthetic_runs import PEAKS, winner_records, frame_of, synthetic_record, write_run

MIXED = "2x2048 + 32x1@1024"
MIXED_Q, MIXED_KV = (2048, 2048) + (1,) * 32, (2048, 2048) + (1024,) * 32
UNIFORM_LENS = (64, 128, 256, 512)  # padding share 1 − (64² + 128² + 256² + 512²) / (4·512²)
LONGTAIL_LENS = (32, 32, 32, 1024)  # padding share 1 − (3·32² + 1024²) / (4·1024²)
DECODE_KV = (1000, 3000)  # 4000 KV tokens; bf16, H_kv 2, d 64: 512 bytes a token, 2.048 MB a batch
# Batches written term by term, so a real Case's lengths are exactly these (a Case checks them against its description).
UNIFORM, LONGTAIL = "1x64 + 1x128 + 1x256 + 1x512", "3x32 + 1x1024"
DECODE, CHUNKED = "1x1@1000 + 1x1@3000", "1x256@1000 + 1x256@3000"


def serving_record(layout: str, dist: str, lens_q: tuple[int, ...], lens_kv: tuple[int, ...], backend: str, ms: float, *,
                   page_size: int | None = None, plan_ms: float | None = None, agree: bool | None = True, spread: float = 0.01) -> Record:
    """A row of a ragged batch, shaped like SERVING's records: the batch's fields, its real-token KV bytes, its plan time."""
    fields = dict(B=len(lens_q), S_q=max(lens_q), S_kv=max(lens_kv), H=8, H_kv=2, d_k=64, d_v=64, dtype="bf16")
    batch = dict(layout=layout, page_size=page_size, seq_lens_q=tuple(lens_q), seq_lens_kv=tuple(lens_kv), length_dist=dist)
    if "layout" in Case.__dataclass_fields__:  # the serving data model is merged: the case is the batch, its id says so
        case = Case(**fields, **batch)
    else:  # before it, a seed per batch and layout keeps their case ids apart
        case = Case(**fields, seed=zlib.crc32(repr(sorted(batch.items())).encode()) % 10**6 + 1)
    record = synthetic_record(case, backend, ms, agree=agree, spread=spread)
    record.kv_cache_bytes = sum(lens_kv) * theory.kv_cache_bytes_per_token(case)
    extra = {**batch, "seq_lens_q": list(lens_q), "seq_lens_kv": list(lens_kv), "tokens_q": sum(lens_q), "tokens_kv": sum(lens_kv), "plan_ms": plan_ms}
    for name, value in extra.items():
        if hasattr(record, name):
            setattr(record, name, value)
        else:
            record.extra[name] = value
    return record


def _skew_records() -> list[Record]:
    records = []
    for dist, lens, padded_ms, packed_ms in (("256", (256,) * 4, 1.0, 1.0), (UNIFORM, UNIFORM_LENS, 3.0, 1.2),
                                             (LONGTAIL, LONGTAIL_LENS, 4.0, 1.0)):
        records.append(serving_record("padded", dist, lens, lens, "sdpa", padded_ms))
        records.append(serving_record("packed", dist, lens, lens, "sdpa", packed_ms))
        records.append(serving_record("padded", dist, lens, lens, "naive", 2 * padded_ms))
    # naive's packed row of one batch disagrees: that pair has no speed-up, the others none at all (no packed row)
    records.append(serving_record("packed", UNIFORM, UNIFORM_LENS, UNIFORM_LENS, "naive", 0.1, agree=False))
    return records


def _decode_records() -> list[Record]:
    records = []
    for page_size, ms_a, ms_b in ((1, 2.048 / 10, 2.048 / 5), (16, 2.048 / 25, 2.048 / 20), (128, 2.048 / 150, 2.048 / 40)):
        records.append(serving_record("paged", DECODE, (1, 1), DECODE_KV, "paged-a", ms_a, page_size=page_size))
        records.append(serving_record("paged", DECODE, (1, 1), DECODE_KV, "paged-b", ms_b, page_size=page_size))
    records.append(serving_record("paged", DECODE, (1, 1), DECODE_KV, "paged-c", 0.001, page_size=16, agree=False))
    records.append(serving_record("paged", CHUNKED, (256, 256), DECODE_KV, "paged-a", 1.0, page_size=16))  # a prefill: not decode
    return records


def _mixed_records() -> list[Record]:
    return [
        serving_record("packed", MIXED, MIXED_Q, MIXED_KV, "lib-a", 2.0),
        serving_record("packed", MIXED, MIXED_Q, MIXED_KV, "lib-b", 1.5, plan_ms=0.3),
        serving_record("paged", MIXED, MIXED_Q, MIXED_KV, "lib-a", 1.0, page_size=16, plan_ms=0.05),
        serving_record("paged", MIXED, MIXED_Q, MIXED_KV, "lib-b", 1.01, page_size=16, spread=0.05),
        serving_record("paged", MIXED, MIXED_Q, MIXED_KV, "lib-c", 0.2, page_size=16, agree=False),
    ]


# -- the three views, on known answers -------------------------------------------------------------
def test_packed_against_padded_gives_the_speedup_beside_the_padding_share():
    table = serving.packed_vs_padded(frame_of(_skew_records()))
    assert list(table["backend"]) == ["sdpa"] * 3  # naive: its only packed row disagrees
    by_batch = table.set_index("batch")
    assert by_batch.loc["256", "padding_share"] == 0.0 and by_batch.loc["256", "speedup"] == pytest.approx(1.0)
    assert bool(by_batch.loc["256", "within_noise"])  # equal medians are no speed-up
    uniform = 1 - sum(n * n for n in UNIFORM_LENS) / (4 * 512**2)
    assert by_batch.loc[UNIFORM, "padding_share"] == pytest.approx(uniform)
    assert by_batch.loc[UNIFORM, "speedup"] == pytest.approx(2.5) and not by_batch.loc[UNIFORM, "within_noise"]
    assert by_batch.loc[UNIFORM, "ideal_speedup"] == pytest.approx(1 / (1 - uniform))
    longtail = 1 - (3 * 32**2 + 1024**2) / (4 * 1024**2)
    assert by_batch.loc[LONGTAIL, "padding_share"] == pytest.approx(longtail)
    assert by_batch.loc[LONGTAIL, "speedup"] == pytest.approx(4.0)
    assert by_batch.loc[LONGTAIL, "kv_max_over_mean"] == pytest.approx(1024 / ((3 * 32 + 1024) / 4))
    assert list(table["padding_share"]) == sorted(table["padding_share"])  # ordered as the skew grows


def test_paged_decode_bandwidth_is_the_kv_read_against_the_copy_peak():
    table = serving.paged_decode_bandwidth(frame_of(_decode_records()))
    assert set(table["backend"]) == {"paged-a", "paged-b"}  # paged-c disagrees; the prefill row is not a decode
    kv_bytes = sum(DECODE_KV) * 2 * (64 + 64) * 2
    assert (table["kv_bytes"] == kv_bytes).all()
    a = table[table["backend"] == "paged-a"].set_index("page_size")
    assert list(a.index) == [1, 16, 128]
    assert a["kv_gbps"].tolist() == pytest.approx([10.0, 25.0, 150.0])
    assert a["pct_copy_peak"].tolist() == pytest.approx([10.0, 25.0, 150.0])  # PEAKS: a 100 GB/s copy
    assert a["impossible"].tolist() == [False, False, True]
    b = table[table["backend"] == "paged-b"].set_index("page_size")
    assert b["kv_gbps"].tolist() == pytest.approx([5.0, 20.0, 40.0]) and not b["impossible"].any()


def test_the_winner_per_batch_is_judged_per_layout_and_page_size():
    wins = serving.batch_winners(frame_of(_mixed_records())).set_index("layout")
    assert set(wins["batch"]) == {MIXED} and len(wins) == 2
    assert wins.loc["packed", "winner"] == "lib-b" and wins.loc["packed", "runner_up"] == "lib-a"
    assert wins.loc["packed", "margin_pct"] == pytest.approx(100 / 3) and not wins.loc["packed", "within_noise"]
    assert wins.loc["packed", "winner_plan_ms"] == pytest.approx(0.3)
    # lib-c is five times faster on the paged batch but disagrees; lib-b is 1 % slower than lib-a, within their spread
    assert wins.loc["paged", "winner"] == "lib-a" and wins.loc["paged", "page_size"] == 16 and wins.loc["paged", "candidates"] == 2
    assert bool(wins.loc["paged", "within_noise"]) and wins.loc["paged", "winner_plan_ms"] == pytest.approx(0.05)
    assert wins.loc["packed", "tokens_q"] == 4096 + 32 and wins.loc["packed", "tokens_kv"] == 4096 + 32 * 1024


def test_lengths_are_read_from_json_lists_and_from_their_csv_text_and_a_row_without_them_is_named():
    assert serving.lengths([3, 1]) == (3, 1) and serving.lengths("[3, 1]") == (3, 1)
    assert serving.lengths(None) is None and serving.lengths("") is None and serving.lengths(float("nan")) is None
    frame = frame_of(_mixed_records())
    frame.loc[0, "seq_lens_kv"] = None
    assert list(serving.rows_without_lengths(frame)["backend"]) == ["lib-a"]
    section = serving_sections(frame, backend_colors(frame["backend"]))[0]
    assert any(isinstance(b, str) and "without sequence lengths (seq_lens_q, seq_lens_kv) are in no view below: 1," in b for b in section.blocks)


# -- the report section --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_serving_section_appears_with_serving_rows_only(tmp_path):
    records = _skew_records() + _decode_records() + _mixed_records()
    page = build_report([write_run(tmp_path / "results" / "serving", records, peaks=PEAKS)], out_root=tmp_path / "reports")
    html = page.read_text()
    section = html.split('<section id="serving">', 1)[1].split("</section>", 1)[0]
    assert section.count("<img") == 3  # skew, bandwidth, and one winner grid per fixed-parameter group (one here)
    for name in ("packed_vs_padded.csv", "paged_decode_bandwidth.csv", "batch_winners.csv"):
        assert f'href="{name}"' in html
    wins = pd.read_csv(page.parent / "batch_winners.csv")
    assert set(wins["winner"]) == {"lib-a", "lib-b", "sdpa", "paged-a"} and "impossible" in section
    order = wins[wins["batch"].isin(("256", DECODE))]  # by batch; within one, padded, packed, then paged by page size
    assert list(zip(order["layout"], order["page_size"].fillna(0))) == [("paged", 1), ("paged", 16), ("paged", 128), ("padded", 0), ("packed", 0)]
    assert not serving.has_serving_rows(frame_of(winner_records()).assign(layout="dense"))  # merged records: every row has a layout
    dense = build_report([write_run(tmp_path / "results" / "dense", winner_records())], out_root=tmp_path / "reports")
    assert '<section id="serving">' not in dense.read_text() and not (dense.parent / "batch_winners.csv").exists()


# -- recommend --batch ---------------------------------------------------------------------------------
def test_recommend_with_a_batch_answers_from_that_batch_only(tmp_path, capsys):
    records = _skew_records() + _mixed_records()
    run = write_run(tmp_path / "run", records)
    assert main(["recommend", str(run), "--batch", "  2x2048+32x1@1024 "]) == 0
    out = capsys.readouterr().out
    first, *rest = out.splitlines()
    # The one answer first, over both layouts of the batch: the best backend and layout; then each case's.
    assert first.startswith(f"best for the batch {MIXED}: lib-a (paged, page 16) (1 ms); the runner-up lib-b (paged, page 16)")
    answered = {line.split(":", 1)[0] for line in rest if not line.startswith(" ") and not line.startswith("per case")}
    assert answered == {r.case_id for r in _mixed_records()}
    assert "lib-b (1.5 ms); the runner-up lib-a takes 1.33× the time (2 ms)" in out and "sdpa" not in out
    assert main(["recommend", str(run), "--batch", "1x64+1x128 + 1x256+ 1x512", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "only candidate: sdpa (1.2 ms), the one backend that ran, agreed and carries no flag: not a win" in out and "lib-a" not in out


def test_recommend_with_an_unknown_batch_names_the_runs_batches_in_one_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", _skew_records() + _mixed_records())
    assert main(["recommend", str(run), "--batch", "2x4096"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no batch '2x4096'" in err
    assert f"its batches are {'; '.join(sorted({MIXED, '256', UNIFORM, LONGTAIL}))}" in err
    dense = write_run(tmp_path / "dense", winner_records())
    assert main(["recommend", str(dense), "--batch", MIXED]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "it has no serving batches" in err
