"""The benchmark itself, as pytest tests: one per (case, backend) of the suite given by --attnbench-suite.

Run through `attnbench run` (which supervises these workers), or directly:
`pytest suites/test_bench.py --attnbench-suite quick -k sdpa`.
"""

import pytest

from harness.results.record import Status


def test_attention(attn_pair, benchmark, attnbench_session):
    """Measure one pair, write its record, and report unsupported pairs as skips and failures as failures."""
    case, backend = attn_pair
    record = attnbench_session.run(case, backend, benchmark)
    if record.status is Status.UNSUPPORTED:
        pytest.skip(f"unsupported: {record.reason}")
    if record.status is Status.OOM:
        pytest.skip(f"out of memory: {record.reason}")
    if record.status is not Status.OK:
        pytest.fail(f"{record.status}: {record.reason}", pytrace=False)
