"""Published peak figures of a few GPUs, beside the measured and the clock-scaled ceilings: a small table, each entry cited.

Dense tensor-core rates (NVIDIA quotes its headline figures with 2:4 sparsity; dense is half of those) at the
boost clock, and the HBM bandwidth (bytes moved per second, comparable with the copy ceiling's read plus written), as the vendor's datasheet gives them. A datasheet is an upper bound a
kernel never quite reaches (our H200 measured a bf16 8192² product at 801 TFLOP/s of the 989 listed, and a
copy at 4.25 of 4.8 TB/s); it is shown so that a reader can tell a low share of a measured peak from a low
measured peak. Device models are matched by the name torch and NVML report ("NVIDIA H200").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Datasheet:
    """One GPU model's published dense TFLOP/s per dtype and its memory bandwidth (GB/s), with where they come from."""

    tflops: Mapping[str, float]
    gbps: float
    source: str

    def tflops_of(self, dtype: str | None) -> float | None:
        """The listed dense TFLOP/s of a row's dtype: both FP8 formats (fp8_e4m3, fp8_e5m2) read the sheet's one `fp8` figure."""
        if not dtype:
            return None
        return self.tflops.get(SHEET_DTYPE.get(dtype, dtype))


#: A row's dtype → the datasheet's name for its rate: vendors list one FP8 figure, for e4m3 and e5m2 alike.
SHEET_DTYPE = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}

_HOPPER_TFLOPS = {"fp64": 67.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}

DATASHEETS: Mapping[str, Datasheet] = {
    "NVIDIA H100 80GB HBM3": Datasheet(_HOPPER_TFLOPS, 3350.0,
                                       "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (sparsity figures halved)"),
    "NVIDIA H200": Datasheet(_HOPPER_TFLOPS, 4800.0,
                             "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (sparsity figures halved)"),
    "NVIDIA B200": Datasheet({"fp64": 40.0, "fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, 8000.0,
                             "NVIDIA Blackwell datasheet, HGX B200 at 1,000 W (dense)"),
}
#: fp32 matmuls on tensor cores run as tf32 only when torch allows it; without, fp32 is the CUDA-core rate above.


def datasheet_of(device_model: str | None) -> Datasheet | None:
    """The published figures of a device model (by torch's / NVML's name, an H100 SXM under its full name), or None."""
    if not device_model:
        return None
    if device_model in DATASHEETS:
        return DATASHEETS[device_model]
    for name, sheet in DATASHEETS.items():  # "NVIDIA H200 NVL" is another board: only an exact or SXM-named match counts
        if device_model.replace(" SXM", "") == name:
            return sheet
    return None
