"""The benchmark as pytest tests: one per (case, backend) of the suite given by --attnbench-suite, timed by pytest-benchmark.

`pytest suites/test_bench.py --attnbench-suite quick -k sdpa [--benchmark-json out.json]`: pytest-benchmark's
table, JSON and compare hold the same samples as the records appended to --attnbench-run-dir.
(`attnbench run` runs the same pairs through the same worker loop without pytest.)
"""

import pytest

from harness.results.record import Status


def test_attention(attn_pair, benchmark, attnbench_session, attnbench_timer):
    """Measure one pair, write its record, and report unsupported pairs as skips and failures as failures."""
    case, backend = attn_pair
    record = attnbench_session.run(case, backend, benchmark, attnbench_timer)
    if record.status is Status.UNSUPPORTED:
        pytest.skip(f"unsupported: {record.reason}")
    if record.status is Status.OOM:
        pytest.skip(f"out of memory: {record.reason}")
    if record.status is not Status.OK:
        pytest.fail(f"{record.status}: {record.reason}", pytrace=False)
