"""Where the FlashAttention tests find the libraries' real code, and the real signatures built from it.

FA2 and FA3 from flash-attn 2.8.3's sdist, at $ATTNBENCH_FLASH_ATTN_SDIST or <venv>/share/attnbench/flash_attn-2.8.3.tar.gz;
FA4 from flash-attn-4 4.0.0b36 as installed, else its wheel ($ATTNBENCH_FLASH_ATTN4_WHEEL or beside the sdist). Shared by
tests/test_flash_attn_library.py and tests/test_gpu_variants.py (a helper module: a test module imported twice is two copies).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from harness.backends.flashattention.adapter import FlashAttn2Backend, FlashAttn3Backend, FlashAttn4Backend
from tests.real_signatures import read_members, signature_from_source

SDIST_ENV = "ATTNBENCH_FLASH_ATTN_SDIST"
#: Where setup puts the sources these tests read (the environment's own share/ folder), unless the variables say.
SOURCES = Path(sys.prefix) / "share" / "attnbench"
SDIST = Path(os.environ.get(SDIST_ENV) or SOURCES / "flash_attn-2.8.3.tar.gz")
FA4_WHEEL_ENV = "ATTNBENCH_FLASH_ATTN4_WHEEL"
FA4_WHEEL = Path(os.environ.get(FA4_WHEEL_ENV) or SOURCES / "flash_attn_4-4.0.0b36-py3-none-any.whl")
BACKENDS = {2: FlashAttn2Backend, 3: FlashAttn3Backend, 4: FlashAttn4Backend}


#: The sdist's files these tests read.
SDIST_FILES = ("flash_attn/flash_attn_interface.py", "csrc/flash_attn/flash_api.cpp", "hopper/flash_attn_interface.py", "hopper/setup.py")


@functools.lru_cache(maxsize=None)
def _sdist_files() -> dict[str, str]:
    return read_members(SDIST, SDIST_FILES) if SDIST.exists() else {}


def sdist_text(relative: str) -> str:
    """A file of flash-attn 2.8.3's sdist; skips when the sdist is not on this machine."""
    if not SDIST.exists():
        pytest.skip(f"flash-attn 2.8.3 sdist not at {SDIST} (set {SDIST_ENV}; fetch with: pip download --no-deps "
                    "--no-build-isolation --no-binary :all: flash-attn==2.8.3, FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE)")
    text = _sdist_files().get(relative)
    assert text is not None, f"{relative} is not in {SDIST}"
    return text


@functools.lru_cache(maxsize=None)
def fa4_text() -> str:
    """flash-attn-4's flash_attn/cute/interface.py: as installed, else from its wheel; skips when neither is here."""
    try:
        return Path(metadata.distribution("flash-attn-4").locate_file("flash_attn/cute/interface.py")).read_text()
    except metadata.PackageNotFoundError:
        pass
    if not FA4_WHEEL.exists():
        pytest.skip(f"flash-attn-4 is neither installed nor at {FA4_WHEEL} (set {FA4_WHEEL_ENV}; fetch with: "
                    "pip download --no-deps flash-attn-4==4.0.0b36)")
    with zipfile.ZipFile(FA4_WHEEL) as wheel:  # a pure-Python wheel: the source as it would install
        return wheel.read("flash_attn/cute/interface.py").decode()


def source(generation: int) -> str:
    """The Python interface FlashAttention `generation` is called through."""
    return {2: lambda: sdist_text("flash_attn/flash_attn_interface.py"),
            3: lambda: sdist_text("hopper/flash_attn_interface.py"), 4: fa4_text}[generation]()


@functools.lru_cache(maxsize=None)
def real_signature(generation: int, function: str) -> inspect.Signature:
    """The library's own signature of `function`: imported where it imports, else built from its source."""
    try:
        return inspect.signature(getattr(importlib.import_module(BACKENDS[generation].module), function))
    except Exception:  # not installed, a bare namespace, or no CUTLASS DSL / CUDA extension here
        return signature_from_source(source(generation), function)
