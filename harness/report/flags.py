"""The report's Sample flags section: the measured rows whose samples (or kernels) the harness itself distrusts, and why.

Three flags keep a row from deciding anything (harness.analysis.trust): `contended`, `suspect` and `kernel_mismatch`
(the kernel proof: the profiler did not show the kernel the backend claims, with the reason). Four more are
set while a row is timed (harness.measure.timing): `too_short`, a sample so short that
the clock's tick is more than 1 % of it; `launch_leaked`, CUDA samples that may hold the host's launch
time; `drifted`, samples that moved while they were taken; and `stopped_by = call_exceeds_budget`,
fewer samples than the minimum because one call costs more than the budget. A flag nobody sees is no
flag: each flagged row is listed here with what the flag means. Where bf16 rows ran on a CPU without
native bf16, the section says why they are slow.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from harness.analysis.frame import agreeing_rows, ok_rows
from harness.analysis.trust import UNTRUSTED_FLAGS, is_set, left_out, untrusted
from harness.results.vocabulary import DRIFT_FLAG_PCT, MIN_SAMPLE_TICKS, STOP_CALL_EXCEEDS_BUDGET, STOP_FIRST_CALL
from harness.report.page import esc
from harness.report.writer import Csv, Section, Table

#: Each flag, in words, as the section states it.
FLAG_WORDS = {
    "too_short": f"the shortest sample lasts under {MIN_SAMPLE_TICKS} ticks of the clock (the tick column, as far as it is known): "
                 "quantisation alone may move a sample by more than 1 %, so the row's latency is known less precisely than its "
                 "interval says. Time more calls per sample (a larger case, or a CPU budget with a longer min_sample_s).",
    "launch_leaked": "the number of CUDA samples whose interval may hold host launch time: the host took longer to reach the timed "
                     "call than the GPU spin queued before it lasted, so the GPU may have waited for the launch and that wait is in "
                     "the sample. A row with many such samples reads slower than its kernels ran.",
    "drifted": f"the last third of the samples' median differs from the first third's by at least {DRIFT_FLAG_PCT:g} % (drift_pct) "
               "and their 95 % intervals do not overlap: the device changed while the row was measured (a GPU clock ramping from "
               "idle, heat, another process), so its median depends on when it was taken. Such a row is always sampled to its budget.",
    "call_exceeds_budget": "one call costs more than the pair's time budget holds, so the row took fewer samples than the minimum "
                   "(stopped_by call_exceeds_budget): under 6 samples it has no 95 % interval, and its median is a rough figure. "
                   "With stopped_by first_call the pair's first call cost five budgets or more and is its one sample, with no "
                   "warm-up call before it: a figure for a call that slow, not a steady-state latency.",
}
#: What leaving a contended or suspect row out means, said after each flag's own words.
_LEFT_OUT = ("the row is shown, and left out of every winner, recommendation, speed-up, fit, crossover and comparison verdict "
             "(harness.analysis.trust). Re-measure it on a quiet machine (its repro).")
#: The evidence each untrusted flag is read from, in the record's columns.
_EVIDENCE = {"contended": " (run_queue_wait_ratio, involuntary_switches; gpu_other_processes on a GPU)", "suspect": " (iqr_ratio)",
             "throttled": " (gpu_sm_clock_mhz_min, gpu_throttle_reasons, throttle_reason)"}
FLAG_WORDS.update({name: f"{why}{_EVIDENCE.get(name, '')}: {_LEFT_OUT}" for name, why in UNTRUSTED_FLAGS.items()})
#: What the kernel proof is, said in the section: a quiet machine does not fix a row that ran another kernel.
FLAG_WORDS["kernel_mismatch"] = (
    "a backend may claim the kernels a case must run: FP8 cases (dtype or kv_dtype fp8_e4m3/fp8_e5m2) an FP8 kernel or "
    "operator (eager-fp8: aten::_scaled_mm), MLA cases an MLA kernel (flashmla: flash_fwd_splitkv_mla_kernel). For such a "
    "pair one untimed call runs under torch.profiler after the check, and the row lists what ran (kernels: CUDA kernels, "
    "or operators on a CPU). The row is kernel_mismatch when no traced name holds a claimed one, or when an FP8 claim's "
    "trace holds a GEMM on bf16, fp16 or fp32 operands that no claimed operator called (the dequantize-then-GEMM "
    "fallback, told by the operand dtypes the profiler records); kernel_mismatch_reason says which. Such a row measured "
    "another path than it claims: it is shown, and left out of every winner, recommendation, speed-up, fit, crossover and "
    "comparison verdict (harness.analysis.trust). Fix the path, or the claim, and run it again.")
#: The columns of the flagged rows' table and CSV.
FLAG_COLUMNS = ["case_id", "backend", "contended", "suspect", "kernel_mismatch", "kernel_mismatch_reason",
                "too_short", "launch_leaked", "drifted", "drift_pct", "stopped_by", "latency_ms_min", "latency_ms_median", "samples",
                "clock_resolution_s", "run_id"]


def _flags(ok: pd.DataFrame) -> dict[str, pd.Series]:
    """Per flag, which of the measured rows `ok` carry it (all False where the column is missing)."""
    none = pd.Series(False, index=ok.index)
    return {
        **{name: ok[name].map(is_set).astype(bool) if name in ok.columns else none for name in UNTRUSTED_FLAGS},
        "too_short": ok["too_short"].map(lambda v: v is True) if "too_short" in ok.columns else none,
        "launch_leaked": pd.to_numeric(ok["launch_leaked"], errors="coerce").fillna(0) > 0 if "launch_leaked" in ok.columns else none,
        "drifted": ok["drifted"].map(lambda v: v is True) if "drifted" in ok.columns else none,
        "call_exceeds_budget": ok["stopped_by"].astype(object).isin([STOP_CALL_EXCEEDS_BUDGET, STOP_FIRST_CALL]) if "stopped_by" in ok.columns else none,
    }


def flagged_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows that carry any flag (`_flags`), in FLAG_COLUMNS (empty without the flags' columns)."""
    ok = frame[frame["status"] == "ok"]
    any_flag = pd.Series(False, index=ok.index)
    for flag in _flags(ok).values():
        any_flag |= flag
    return ok[any_flag].reindex(columns=FLAG_COLUMNS)


def flag_summary(frame: pd.DataFrame) -> str | None:
    """One sentence for the overview: how many measured rows carry which flag (None when none does)."""
    rows = flagged_rows(frame)
    if rows.empty:
        return None
    measured = int((frame["status"] == "ok").sum())
    counts = {name: int(flag.sum()) for name, flag in _flags(rows).items()}
    words = {"contended": "contended", "suspect": "suspect", "kernel_mismatch": "not running the kernel they claim",
             "too_short": "too short for the clock's tick",
             "launch_leaked": "with launch-leaked samples", "drifted": "drifting while measured",
             "call_exceeds_budget": "with fewer samples than the minimum"}
    listed = ", ".join(f"{counts[name]} {text}" for name, text in words.items() if counts[name])
    return f"{len(rows)} of {measured} measured rows carry a sample flag ({listed}): see Sample flags before trusting their medians."


def trust_summary(frame: pd.DataFrame, wins: pd.DataFrame) -> str | None:
    """One sentence for the overview: the contended and suspect rows every choice left out, and the cases left with no winner."""
    candidates = agreeing_rows(frame, flagged=True)
    gone = left_out(ok_rows(frame))
    if not gone:
        return None
    won = set(wins["case_id"]) if not wins.empty else set()
    orphans = sorted(set(candidates.loc[untrusted(candidates), "case_id"]) - won)
    text = gone.sentence("every winner, recommendation, speed-up, fit and crossover on this page")
    if orphans:
        text += f"; {len(orphans)} cases have no winner, because every row of theirs that agreed is flagged"
    return text + "."


def emulated_bf16_note(frame: pd.DataFrame, envs: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why bf16 rows measured on a CPU without native bf16 (env.json's `cpu_bf16_native` false) are slow; None where there are none."""
    ok = frame[(frame["status"] == "ok") & (frame["device"].astype(str) == "cpu") & (frame["dtype"].astype(str) == "bf16")]
    emulated = {rid: env.get("before") or {} for rid, env in envs.items() if (env.get("before") or {}).get("cpu_bf16_native") is False}
    rows = ok[ok["run_id"].isin(list(emulated))] if "run_id" in ok.columns else ok.iloc[0:0]
    if rows.empty:
        return None
    capability = ", ".join(sorted({str(before.get("cpu_capability") or "unknown") for before in emulated.values()}))
    few = int(_flags(rows)["call_exceeds_budget"].sum())
    return (f"{len(rows)} bf16 rows ran on a CPU without native bf16 (torch's CPU capability {capability}; no avx512_bf16 or amx_bf16): "
            "its bf16 matmuls take torch's fallback GEMM (one thread, no bf16 instructions), 8 to 60 times slower than fp32 "
            "as the operands' layout goes, so these rows time that fallback, "
            f"not what the backend would cost on a CPU with bf16 (or a GPU)" + (f"; {few} of them took fewer samples than the minimum." if few else "."))


def flags_section(frame: pd.DataFrame, envs: Mapping[str, Mapping[str, Any]] | None = None) -> Section:
    """Which rows carry a sample flag, with what each flag means, and why emulated-bf16 rows are slow (`envs`: env.json per run id)."""
    body = [f"<p><b>{name}</b>: {words}</p>" for name, words in FLAG_WORDS.items()]
    slow = emulated_bf16_note(frame, envs or {})
    if slow:
        body.append(f"<p><b>slow bf16</b>: {esc(slow)}</p>")
    rows = flagged_rows(frame)
    measured = int((frame["status"] == "ok").sum())
    if rows.empty:
        body.append(f'<p class="muted">No measured row carries a flag, contended and suspect included ({measured} checked).</p>')
    else:
        body.append(f"<p>{len(rows)} of {measured} measured rows carry a flag:</p>")
        body.append(Csv(rows, "sample_flags.csv"))
        headers = ["case", "backend", "contended", "suspect", "kernel mismatch", "why (kernels)", "too short", "launch-leaked samples",
                   "drifted", "drift (%)", "stopped by", "min (ms)", "median (ms)", "samples", "tick (s)", "run"]
        body.append(Table(rows, headers=headers))
    return Section("flags", "Sample flags", body, nav="Flags")
