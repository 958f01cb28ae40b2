"""The CUDA clock on a simulated host/GPU timeline whose GPU clock rate changes, as a real one's does.

An idle H200 ran the spin kernel at 1.38e8 cycles/s, a busy one at 1.37e9: a clock that keeps the
rate it measured cold sizes every spin a tenth too short, and the host's launch time enters every
sample. These tests hold the clock to the device time whatever the rate does, and to counting
every sample that still holds launch time.
"""

import pytest

from harness.measure.cuda_clock import SPIN_MAX_S, CudaEventClock
from harness.measure.timing import Budget, clock_resolution, measure, sample_grid, tick_bound, too_short
from tests.fake_clock import FakeClock
from tests.gpu_timeline import Timeline
from tests.h200_data import h200_records, needs_h200

COLD = 1.38e8  # spin cycles per second, GPU idling at 345 MHz
HOT = 1.37e9  # after two seconds of matmuls


def sample(clock, tl, host_s, device_s):
    """One sample as the loops take it: a reading, the call, a reading; and whether the clock flagged it."""
    start = clock()
    tl.call(host_s, device_s)
    end = clock()
    # getattr: run against a clock that keeps no such count, the values are what fail, not a name.
    return end - start, getattr(clock, "readings", None) in getattr(clock, "leaked", ())


def test_a_clock_calibrated_on_an_idle_gpu_reads_device_time_once_the_gpu_is_busy():
    # The decode kernel: 200 µs of Python before a 5 µs kernel. Calibrated cold, the old clock
    # spun 400 µs worth of cold cycles, 40 µs at the hot rate, and read 165 µs for every sample.
    tl = Timeline(COLD)
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    tl.rate = HOT
    samples = [sample(clock, tl, 200e-6, 5e-6) for _ in range(8)]
    assert [s for s, _ in samples[-5:]] == pytest.approx([5e-6] * 5, rel=1e-9, abs=1e-12)
    assert not any(leaked for _, leaked in samples[-5:])


def test_a_clock_made_on_a_busy_gpu_is_right_from_its_first_sample_whatever_an_earlier_clock_measured():
    # The old clock measured the rate once per process: a second clock inherited the first one's cold rate.
    tl = Timeline(COLD)
    CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    tl.rate = HOT
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    first, leaked = sample(clock, tl, 50e-6, 10e-6)  # the first spin (100 µs) covers a 50 µs launch
    assert first == pytest.approx(10e-6, rel=1e-9) and not leaked


@pytest.mark.parametrize("host_s,device_s", [(30e-6, 10e-6), (200e-6, 5e-6), (20e-6, 3e-3), (1.5e-3, 20e-6), (5e-3, 20e-6)])
@pytest.mark.parametrize("before,during", [(COLD, HOT), (HOT, COLD), (HOT, HOT)])
def test_every_sample_holding_launch_time_is_flagged_and_no_exact_one_is(host_s, device_s, before, during):
    # The GPU's clock changes after warm-up, mid-measurement: whatever it does, a sample either is
    # the device time or is counted as leaked.
    tl = Timeline(before)
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    for _ in range(4):
        sample(clock, tl, host_s, device_s)
    tl.ramp = (tl.kernels + 5, during)
    samples = [sample(clock, tl, host_s, device_s) for _ in range(20)]
    for measured, leaked in samples:
        exact = measured == pytest.approx(device_s, rel=1e-9, abs=1e-12)
        assert exact != leaked, (measured, leaked)
    # Once re-measured, spins cover any host gap within the bound; beyond it, every sample leaks.
    assert all(leaked for _, leaked in samples[-5:]) == (host_s > SPIN_MAX_S)


def test_measure_counts_leaked_samples_only_not_the_untimed_setup_between_them():
    # A 5 ms launch outruns the longest spin (2 ms): every sample holds 3 ms of host time and says so.
    tl = Timeline(COLD)
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    tl.rate = HOT
    budget = Budget(warmup_s=1e-3, measure_s=0.0, min_sample_s=0.0, min_rounds=10, max_rounds=10)
    slow = measure(lambda: tl.call(5e-3, 20e-6), clock, budget, setup=lambda: tl.call(1e-6, 1e-3))
    assert slow.launch_leaked == 10
    assert slow.stats.median == pytest.approx(20e-6 + 5e-3 - SPIN_MAX_S, rel=1e-6)
    # A slow host-side setup (an L2 flush's launch) leaks into the untimed interval between samples,
    # which is no sample: nothing is counted, and the samples are the device time.
    fast = measure(lambda: tl.call(50e-6, 20e-6), clock, budget, setup=lambda: tl.call(10e-3, 1e-3))
    assert fast.launch_leaked == 0
    assert fast.stats.median == pytest.approx(20e-6, rel=1e-9)


def test_measure_through_a_cold_calibrated_clock_gives_the_kernel_time():
    tl = Timeline(COLD)
    clock = CudaEventClock(torch_module=tl, host_clock=tl.host_clock)
    tl.rate = HOT
    budget = Budget(warmup_s=1e-3, measure_s=0.0, min_sample_s=0.0, min_rounds=20, max_rounds=20)
    m = measure(lambda: tl.call(200e-6, 12.5e-6), clock, budget)
    assert m.launch_leaked == 0
    assert list(m.stats.samples) == pytest.approx([12.5e-6] * 20, rel=1e-9)


def test_a_host_clock_has_no_leak_count():
    m = measure(lambda: None, budget=Budget(warmup_s=0.0, measure_s=0.0, min_sample_s=0.0, min_rounds=3, max_rounds=3))
    assert m.launch_leaked is None


# -- too_short: the event clock's tick, not the spin between two readings ---------------------------------------------


def _seconds(record: dict) -> list[float]:
    return [ms / 1e3 for ms in record["sample_ms"]]


@needs_h200
def test_the_h200_rows_flagged_too_short_were_healthy_and_the_event_tick_flags_none():
    from harness.measure.cuda_clock import CudaEventClock

    ok = [r for r in h200_records() if r["status"] == "ok"]
    assert len(ok) == 84
    # What the old rule did: the "resolution" read back to back is the spin between readings (1.3-10 µs).
    old = [r for r in ok if too_short(_seconds(r), r["iterations"], r["clock_resolution_s"])]
    assert len(old) == 25 and old == [r for r in ok if r["too_short"]]
    assert min(r["clock_resolution_s"] for r in ok) > 1.2e-6
    # The samples themselves say what the tick is: 66 of the 84 rows lie on a 32 ns grid (the rest have
    # too few distinct samples to show it, and are bounded by the 0.5 µs CUDA documents).
    grids = [sample_grid(_seconds(r)) for r in ok]
    assert sum(g == pytest.approx(32e-9, rel=1e-3) for g in grids) == 66 and min(grids) == pytest.approx(32e-9, rel=1e-3)
    new = [r for r in ok if too_short(_seconds(r), 1, tick_bound(CudaEventClock.resolution_s, _seconds(r)))]
    assert new == []  # the shortest sample of the slice, 14.9 µs, is 466 ticks of 32 ns


def test_a_clock_that_declares_its_tick_is_not_read_back_to_back_for_it():
    class DeclaredTick:
        resolution_s = 0.5e-6

        def __call__(self) -> float:
            raise AssertionError("read back to back, this clock would measure its spin, not its tick")

    assert clock_resolution(DeclaredTick()) == 0.5e-6


def test_a_sample_is_too_short_only_under_a_hundred_ticks_of_what_is_known_of_the_tick():
    assert sample_grid([15.008e-6, 15.040e-6, 15.040e-6, 15.104e-6]) == pytest.approx(32e-9)
    assert sample_grid([15.04e-6 * (1 + 3e-8), 15.04e-6]) is None  # float32 rounding of one reading is no tick
    assert sample_grid([1e-3] * 5) is None
    assert tick_bound(0.5e-6, [1e-3] * 5) == 0.5e-6  # nothing finer shown: the declared tick stands
    assert tick_bound(0.5e-6, [20e-6, 20.032e-6]) == pytest.approx(32e-9)
    assert too_short([40e-6, 41e-6], 1, 0.5e-6) and not too_short([50e-6, 51e-6], 1, 0.5e-6)
    assert not too_short([1e-9], 1, 0.0)  # a clock that never moved claims nothing


def test_measure_flags_a_short_sample_by_the_declared_tick():
    def timed(call_s: float, tick: float):
        clock = FakeClock()
        clock.resolution_s = tick
        return measure(lambda: clock.advance(call_s), clock, Budget(warmup_s=1e-3, measure_s=1e-3, min_sample_s=0.0, min_rounds=6))

    short = timed(40e-6, 1e-6)
    assert short.too_short and short.clock_resolution_s == 1e-6
    assert not timed(200e-6, 1e-6).too_short
