"""A simulated host/GPU timeline with a fake `torch.cuda` (events, `_sleep`), for testing the CUDA clock on a CPU."""

class Timeline:
    """A simulated host and GPU: kernels queue behind each other and never start before the host launches them.

    `rate` is the GPU clock (spin cycles per second) at the moment a spin is launched; tests change
    it between calibration and measurement, or from a given kernel on (`ramp`). `launch_s` is device
    time every kernel costs before its own work starts, seen between events but not in its kernel
    time (the H200 showed about 4 µs of it per sample).
    """

    def __init__(self, cycles_per_s: float = 1.5e9, launch_s: float = 0.0) -> None:
        self.launch_s = launch_s
        self.host = 0.0
        self.busy_until = 0.0
        self.rate = cycles_per_s
        self.ramp: tuple[int, float] | None = None  # (after this many kernels, the new rate)
        self.kernels = 0
        timeline = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = max(timeline.host, timeline.busy_until)
                timeline.busy_until = self.t

            def synchronize(self):
                timeline.host = max(timeline.host, self.t)

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        class Cuda:
            pass

        self.cuda = Cuda()
        self.cuda.Event = Event
        self.cuda._sleep = lambda cycles: self.kernel(cycles / self.current_rate())

    def current_rate(self) -> float:
        """The GPU clock now (after `ramp`'s kernel count, its new rate)."""
        if self.ramp is not None and self.kernels >= self.ramp[0]:
            self.rate = self.ramp[1]
        return self.rate

    def kernel(self, seconds: float) -> None:
        """Launch a kernel of `seconds` device time at the current host time."""
        self.kernels += 1
        self.busy_until = max(self.host, self.busy_until) + self.launch_s + seconds

    def call(self, host_s: float, device_s: float) -> None:
        """A timed call: `host_s` of Python before its kernel launch, then a kernel of `device_s`."""
        self.host += host_s
        self.kernel(device_s)

    def host_clock(self) -> float:
        """The simulated host's clock."""
        return self.host
