"""The CPU thread count a measurement runs with: torch's intra-op threads, set per timing process.

torch's default is the core count; on a shared machine every extra thread is one more thing other
work can preempt, so a run may pin fewer (as torch.utils.benchmark's Timer `num_threads` does).
"""

from __future__ import annotations

from harness.errors import UserError

#: More threads than any machine this harness runs on has cores; a larger number is a typo.
MAX_THREADS = 1024


def check_threads(n: int | None) -> int | None:
    """`n` if it is a sane thread count (or None), else a UserError naming it."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise UserError(f"--threads must be a whole number from 1 to {MAX_THREADS}, not {n!r}")
    return n


def apply_threads(n: int | None) -> int:
    """Set torch's intra-op threads to `n` when given; return the thread count now in effect."""
    import torch  # only the timing process needs torch; importing this module must stay cheap

    n = check_threads(n)
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return int(torch.get_num_threads())
