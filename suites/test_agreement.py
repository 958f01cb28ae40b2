"""Agreement as pytest tests: one per (case, backend) of the suite given by --attnbench-suite; a disagreement fails.

No timing and no run folder: `pytest suites/test_agreement.py --attnbench-suite quick [--attnbench-backends sdpa]`.
The same verdict as `attnbench check` (harness.checks.correctness.check_pair) and as the `agree` column of a benchmark record.
"""

import pytest

from harness.checks.correctness import check_pair


def test_agreement(attn_check_pair):
    """Check one pair against the float64 reference: unsupported pairs skip, disagreements and errors fail."""
    case, backend = attn_check_pair
    result = check_pair(case, backend)
    if result.verdict in ("unsupported", "not checked", "oom"):
        pytest.skip(f"{result.verdict}: {result.reason}")
    if result.failed:
        a = result.agreement
        detail = f"max|out - ref| = {a.max_abs_err:.3g} > bound {a.err_bound:.3g}" if a and a.max_abs_err is not None and a.err_bound is not None else result.verdict
        note = f" ({result.reason})" if result.reason else ""
        pytest.fail(f"{case.id} [{backend.name}] disagrees with the float64 reference: {detail}{note}", pytrace=False)
    assert result.verdict == "agree"
