"""The one NVML reader: NVML (nvidia-ml-py) opened for a session's length, the process's device found by UUID, calls by name.

Everything the harness reads of NVML goes through here: the per-pair GPU state (harness.telemetry.gpu_state),
the energy counter (harness.telemetry.energy, through gpu_state's reader), `run --cooldown`'s temperature
(harness.run.cooldown) and the run's GPU snapshot in env.json
(`gpu_telemetry`, for the run folder). NVML counts its initialisations, so a snapshot's own session opened and closed
beside a worker's long one leaves the worker's open.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

#: What `clocks_locked` can and cannot see, stored beside it.
CLOCKS_LOCKED_NOTE = ("true when an application clock target differs from its default (nvidia-smi -ac); NVML has no reader "
                      "for locked GPU clocks (nvidia-smi -lgc), which show only as SM clocks held below the maximum")


def call(pynvml: Any, name: str, *args: Any) -> Any:
    """An NVML function by name, None when this nvidia-ml-py lacks it or the device does not support it."""
    fn = getattr(pynvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported per query: that query is one None
        return None


def first(pynvml: Any, names: Sequence[str], *args: Any) -> Any:
    """The first of `names` that answers, None when none does."""
    for name in names:
        value = call(pynvml, name, *args)
        if value is not None:
            return value
    return None


def throttle_reasons(pynvml: Any, handle: Any) -> int | None:
    """The device's clock throttle (event) reason bits now."""
    # Renamed over releases: "throttle" reasons became "event" reasons in nvidia-ml-py 12.x.
    return first(pynvml, ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)


#: The NVML functions `device_pids` and `utilization_pct` call, by the names nvidia-ml-py exports (its pynvml.py,
#: e.g. nvidia-ml-py 12.560.30: github.com/XuehaiPan/nvidia-ml-py, pynvml.py at 51b9f13): the unversioned name,
#: which each release points at its newest `_v2`/`_v3` struct, so no version suffix is chosen here.
COMPUTE_PROCESSES = "nvmlDeviceGetComputeRunningProcesses"
UTILIZATION = "nvmlDeviceGetUtilizationRates"


def device_pids(pynvml: Any, handle: Any) -> frozenset[int] | None:
    """The pids of the compute processes NVML sees on the device now, None when it cannot tell."""
    # Compute processes only: a display server's graphics context on a workstation GPU is no rival for the SMs worth flagging every row for.
    processes = call(pynvml, COMPUTE_PROCESSES, handle)
    if processes is None:
        return None
    try:
        return frozenset(int(p.pid) for p in processes)
    except (TypeError, ValueError, AttributeError):  # not a list of process infos: this nvidia-ml-py answers otherwise
        return None


def utilization_pct(pynvml: Any, handle: Any) -> float | None:
    """The device's GPU utilisation (% of NVML's last sample period with a kernel running), None when it cannot tell."""
    rates = call(pynvml, UTILIZATION, handle)
    value = getattr(rates, "gpu", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def watts(milliwatts: float | None) -> float | None:
    """NVML's milliwatts in W."""
    return milliwatts / 1000 if milliwatts is not None else None


def visible_gpus(environ: Mapping[str, str]) -> list[str] | None:
    """The GPUs an inherited CUDA_VISIBLE_DEVICES leaves this process, in order (indices, GPU-… UUIDs, MIG ids); None if unset."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [entry.strip() for entry in visible.split(",") if entry.strip()]


def nvml_handle(pynvml: Any, uuid: str | None, cuda_index: int, visible: list[str] | None = None) -> Any:
    """The NVML handle of the process's CUDA device: by its UUID where torch gives one, else through CUDA_VISIBLE_DEVICES.

    NVML numbers every GPU of the machine, CUDA only those CUDA_VISIBLE_DEVICES leaves (by index or
    UUID), so CUDA's device 0 may be NVML's GPU 3; the UUID is the one name both share. Raises
    LookupError rather than read another process's GPU when neither says which it is.
    """
    if uuid:
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        handle = call(pynvml, "nvmlDeviceGetHandleByUUID", name)
        if handle is not None:
            return handle
    if visible is None:
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
    entry = visible[cuda_index] if cuda_index < len(visible) else ""
    if entry.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    handle = call(pynvml, "nvmlDeviceGetHandleByUUID", entry) if entry else None
    if handle is None:
        raise LookupError(f"cannot tell which NVML device CUDA device {cuda_index} is (CUDA_VISIBLE_DEVICES={','.join(visible)})")
    return handle


class NvmlSession:
    """NVML initialised from `start()` to `close()` (or a `with` block): the one place the harness starts and stops it."""

    def __init__(self, pynvml: Any) -> None:
        self.pynvml = pynvml
        self.closed = False

    @classmethod
    def start(cls, pynvml: Any = None) -> NvmlSession:
        """Import nvidia-ml-py (ImportError when it is missing) and initialise NVML (its exception when there is no driver)."""
        if pynvml is None:
            import pynvml
        pynvml.nvmlInit()
        return cls(pynvml)

    def close(self) -> None:
        """Release this session's hold on NVML; a second close does nothing."""
        if not self.closed:
            self.closed = True
            call(self.pynvml, "nvmlShutdown")  # a driver gone meanwhile has nothing left to release

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cuda_device_handle(self) -> Any:
        """The handle of torch's current CUDA device, found by its UUID (LookupError when it cannot be told apart)."""
        import torch

        index = torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        return nvml_handle(self.pynvml, str(uuid) if uuid is not None else None, index, visible_gpus(os.environ))


def temperature_c(session: NvmlSession, index: int) -> float | None:
    """The temperature (°C) of NVML device `index` (the machine's numbering, not CUDA's), or None where NVML cannot say."""
    nv = session.pynvml
    handle = call(nv, "nvmlDeviceGetHandleByIndex", index)
    reading = None if handle is None else call(nv, "nvmlDeviceGetTemperature", handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
    return None if reading is None else float(reading)


def index_of_uuid(session: NvmlSession, uuid: str) -> int | None:
    """NVML's index of the GPU named by `uuid` (GPU-…), or None (a MIG id, an unknown name)."""
    handle = call(session.pynvml, "nvmlDeviceGetHandleByUUID", uuid)
    index = None if handle is None else call(session.pynvml, "nvmlDeviceGetIndex", handle)
    return None if index is None else int(index)


def application_clocks(read: Callable[..., Any]) -> dict[str, Any]:
    """The application clock targets and defaults (MHz) and whether they were set away from the default, from `read(name, args=...)`."""
    out: dict[str, Any] = {}
    for clock in ("SM", "MEM"):
        for which in ("TARGET", "DEFAULT"):
            out[f"app_{clock.lower()}_clock_{which.lower()}_mhz"] = read("nvmlDeviceGetClock", args=(f"NVML_CLOCK_{clock}", f"NVML_CLOCK_ID_APP_CLOCK_{which}"))
    pairs = [(out[f"app_{c}_clock_target_mhz"], out[f"app_{c}_clock_default_mhz"]) for c in ("sm", "mem")]
    known = [(t, d) for t, d in pairs if t is not None and d is not None]
    out["clocks_locked"] = any(t != d for t, d in known) if known else None
    out["clocks_locked_note"] = CLOCKS_LOCKED_NOTE
    return out


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def machine_gpus(session: NvmlSession) -> list[dict[str, Any]]:
    """Every GPU of the machine (NVML's numbering): name, clocks, temperature, power, throttle reasons, application clocks, driver."""
    nv = session.pynvml
    gpus = []
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)

        def read(name: str, args: Sequence[str] = (), handle: Any = handle) -> Any:
            # Constants by name too: one this nvidia-ml-py lacks makes its query one None, not a crash.
            return call(nv, name, handle, *[getattr(nv, a, None) for a in args])

        throttle = throttle_reasons(nv, handle)
        gpus.append({
            "index": index,
            "name": _text(read("nvmlDeviceGetName")),
            "sm_clock_mhz": read("nvmlDeviceGetClockInfo", args=("NVML_CLOCK_SM",)),
            "mem_clock_mhz": read("nvmlDeviceGetClockInfo", args=("NVML_CLOCK_MEM",)),
            "max_sm_clock_mhz": read("nvmlDeviceGetMaxClockInfo", args=("NVML_CLOCK_SM",)),
            "temperature_c": read("nvmlDeviceGetTemperature", args=("NVML_TEMPERATURE_GPU",)),
            "power_w": watts(read("nvmlDeviceGetPowerUsage")),
            "power_limit_w": watts(read("nvmlDeviceGetEnforcedPowerLimit")),
            "throttle_reasons": throttle,
            "throttle_reasons_hex": hex(throttle) if throttle is not None else None,
            **application_clocks(read),
        })
    driver = _text(nv.nvmlSystemGetDriverVersion())
    for gpu in gpus:
        gpu["driver"] = driver
    return gpus


def gpu_telemetry() -> list[dict[str, Any]] | dict[str, str]:
    """Per-GPU clocks, temperature, power and throttle reasons from NVML (`nvidia-ml-py`), or why not."""
    try:
        session = NvmlSession.start()
    except ImportError:
        return {"unavailable": "nvidia-ml-py (pynvml) is not installed"}
    except Exception as exc:  # no driver, no GPU
        return {"unavailable": f"NVML did not start: {exc}"}
    with session:  # a snapshot's own session: a worker's open one in this process stays open
        return machine_gpus(session)
