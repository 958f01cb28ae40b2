"""CPU peak memory in a fresh process, and the allocator the pairs after it are timed under.

Each test starts its own Python: glibc's malloc state (its dynamic mmap threshold, the free
blocks its arenas hold) is per process, and the pytest process has been through other tests.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.measure.memory import cpu_peak_problem, load_libc

pytestmark = pytest.mark.skipif(cpu_peak_problem(load_libc()) is not None, reason=f"{cpu_peak_problem(load_libc())}")

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(script: str) -> dict:
    """Run `script` in a new interpreter from the checkout's root; it prints one JSON line last."""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


FIRST_PAIR = """
import json, torch
from harness.backends.registry import load_registry
from harness.suite.cases import Case
from harness.suite.inputs import make_inputs
from harness.measure.memory import measure_peak

torch.set_num_threads(2)  # as a worker on the 2-core box
case = Case(B=1, S_q={S}, S_kv={S}, H=8, H_kv=8, d_k=64, d_v=64, dtype="fp32")
fn = load_registry().get("sdpa").prepare(case, make_inputs(case)).fn
# A worker's pair calls the step before its peak is read (the checked call, then the timed ones),
# and their freed outputs are what hid the measured call's.
for _ in range({calls}):
    out = fn()
nbytes = out.numel() * out.element_size()
del out
print(json.dumps({{"peak": measure_peak(fn, "cpu").peak_bytes, "output": nbytes}}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("S,calls", [(2048, 2), (256, 2), (256, 5)])
def test_first_pair_of_a_fresh_process_sees_at_least_its_output(S, calls):
    # The case read 0 (independently 4.9–5.4 MB; the output alone is 4,194,304 bytes): the
    # freed output of earlier calls sat resident in glibc's heap and the measured call reused it.
    got = run_fresh(FIRST_PAIR.format(S=S, calls=calls))
    assert got["output"] == 8 * S * 64 * 4
    assert got["peak"] >= got["output"], got


# Whether glibc still adjusts its mmap threshold: after an N-byte mmapped block is freed, the
# threshold rises above N, so the next N-byte malloc comes from the heap (mallinfo2's hblkhd, the
# bytes in mmapped blocks, does not grow). A pinned threshold (mallopt M_MMAP_THRESHOLD) maps it again.
ALLOCATOR = """
import ctypes, json, torch
from harness.measure.memory import measure_peak

libc = ctypes.CDLL("libc.so.6")

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def threshold_is_dynamic(nbytes):
    first = libc.malloc(nbytes)
    libc.free(first)
    mapped = libc.mallinfo2().hblkhd
    again = libc.malloc(nbytes)
    grew = libc.mallinfo2().hblkhd - mapped
    libc.free(again)
    return grew < nbytes

before = threshold_is_dynamic(8 * 2**20)
peak = measure_peak(lambda: torch.ones(2**22), "cpu").peak_bytes
after = threshold_is_dynamic(9 * 2**20)
print(json.dumps({"before": before, "after": after, "peak": peak}))
"""


@pytest.mark.slow
def test_measuring_memory_leaves_glibcs_dynamic_mmap_threshold_as_it_was():
    # The old probe pinned M_MMAP_THRESHOLD to 128 KiB for good: the pairs timed after it ran under
    # another allocator (1.18–1.23× slower at S=256 for naive and projections).
    pytest.importorskip("ctypes").CDLL("libc.so.6").mallinfo2  # glibc ≥ 2.33
    got = run_fresh(ALLOCATOR)
    assert got["before"] is True
    assert got["after"] == got["before"], got
    assert got["peak"] >= 4 * 2**22 * 0.95  # and the measurement still sees its 16 MiB
