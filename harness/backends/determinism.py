"""Deterministic backward as a case axis: which backends claim one, why the others refuse, and torch's switch.

A backend class sets `deterministic_backward` (True: its backward, run under `deterministic_algorithms`, is
bitwise repeatable) and `feature_reasons["deterministic"]` (why not, for a user; harness.backends.features refuses). The claim is never trusted: the executor
compares two consecutive calls bitwise (the record's `bitwise_repeatable`), and a deterministic case whose calls
differ disagrees.

Torch's `use_deterministic_algorithms(True)`, as PyTorch's aten/src/ATen/native/transformers/ sources have it (recent
releases; a wheel ships no .cpp, so the bitwise check is what vouches for the installed one):
- math: composite matmuls and softmax; deterministic (cuBLAS given CUBLAS_WORKSPACE_CONFIG).
- flash (cuda/attention_backward.cu, `_flash_attention_backward`): passes `deterministic` to FA2's mha_bwd.
- efficient (cuda/attention_backward.cu, `_efficient_attention_backward`): forces `num_splits_key = 1`, its
  deterministic path (TORCH_CHECK only when a caller asked for more splits; a warning in warn_only mode).
- cuDNN (cuda/sdp_utils.cpp, `check_cudnn_deterministic`): cuDNN is not eligible, so forcing it alone raises
  "No available kernel"; default dispatch skips it for flash, efficient or math.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Iterator

import torch
import torch.utils.deterministic  # noqa: F401 - its fill_uninitialized_memory flag

from harness.errors import Unsupported
from harness.suite.cases import Case

#: What cuBLAS needs for reproducible GEMMs under deterministic algorithms (torch raises on CUDA without it): either setting.
CUBLAS_WORKSPACES = (":4096:8", ":16:8")
CUBLAS_WORKSPACE = CUBLAS_WORKSPACES[0]


def cublas_workspace_for(cases: Iterable[Case]) -> dict[str, str]:
    """What a process about to run `cases` must set (unless the user did) before its first CUDA matmul: CUBLAS_WORKSPACE_CONFIG
    when one of them is a deterministic CUDA case, else nothing.

    cuBLAS reads the variable at its first use, before any pair: only processes that will run a deterministic case change its
    workspaces. The processes' entry points set it (a run's worker, gpu-check's child): a library call never edits the environment."""
    if any(case.deterministic and case.device.startswith("cuda") for case in cases):
        return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}
    return {}


@contextlib.contextmanager
def deterministic_algorithms(case: Case) -> Iterator[None]:
    """Torch's deterministic algorithms on for a deterministic case (restored after); a plain case runs as it is.

    On CUDA, cuBLAS is reproducible only with CUBLAS_WORKSPACE_CONFIG set, and it reads the variable when this
    process first uses cuBLAS: a run's worker and gpu-check's child set it at their start when their pairs hold a
    deterministic CUDA case (`cublas_workspace_for`); elsewhere (a check, a library caller) a CUDA deterministic case without it is
    unsupported, saying what to export, where torch would otherwise raise at its first matmul.
    """
    if not case.deterministic:
        yield
        return
    if case.device.startswith("cuda") and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_WORKSPACES:
        raise Unsupported(f"a deterministic CUDA backward needs CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE} (or {CUBLAS_WORKSPACES[1]}) "
                          "exported before the run: cuBLAS reads it at its first use")
    before, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    filling = getattr(torch.utils.deterministic, "fill_uninitialized_memory", None)
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every new empty tensor with NaN: a cost of torch's debugging aid, not of a deterministic
    # kernel, which would otherwise land in the "det" row and in the cost of determinism it is divided by.
    if filling is not None:
        torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
        if filling is not None:
            torch.utils.deterministic.fill_uninitialized_memory = filling


def detached(result: Any) -> list[torch.Tensor] | None:
    """A detached copy of a call's tensors (the output, or each gradient), or None when it returned none."""
    tensors = [result] if isinstance(result, torch.Tensor) else [t for t in result if isinstance(t, torch.Tensor)] \
        if isinstance(result, (tuple, list)) else []
    return [t.detach().clone() for t in tensors] or None


def bitwise_equal(first: list[torch.Tensor] | None, result: Any) -> bool | None:
    """Whether `result` holds exactly the tensors `first` kept (same shapes, dtypes and bits), or None without both."""
    second = detached(result)
    if first is None or second is None:
        return None
    return len(first) == len(second) and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(first, second))


#: The note of a deterministic case whose two calls differ (`Agreement.disagreeing`).
NOT_REPEATABLE = "deterministic backward asked, but two calls' gradients differ bitwise"
