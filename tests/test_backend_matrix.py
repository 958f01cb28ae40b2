"""`attnbench backends --matrix`: on this CPU machine, what each GPU backend would do with each feature, per dtype, with
every refusal's reason (harness.backends.matrix), and the docs page and run file that carry it."""

from __future__ import annotations

import json

import pytest
import torch

from harness.backends.matrix import MATRIX_FILE, capability_matrix, matrix_rows, render
from harness.backends.registry import load_registry
from harness.cli.main import main
from harness.suite.case_values import DTYPES
from scripts import gen_docs
from tests.cli_runs import ROOT

GPU_BACKENDS = ("flash-attn2", "flash-attn3", "flash-attn4", "flashinfer", "flashmla", "flashinfer-mla", "xformers", "naive")


@pytest.fixture(scope="module")
def cells():
    """(backend, device, feature, value, dtype) → cell, for the GPU backends and naive, without asking whether they run here."""
    matrix = capability_matrix(load_registry(plugins=False), names=GPU_BACKENDS, availability=False)
    return {(row.name, c.device, c.feature, c.value, c.dtype): c for row in matrix for c in row.cells}


def test_the_matrix_answers_on_a_cpu_which_gpu_backend_computes_sinks_softcap_fp8_and_paged_mla(cells):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the libraries' per-GPU rules follow its GPU")
    assert cells["flash-attn4", "cuda", "sinks", "sinks", "bf16"].status == "yes"
    sinks2 = cells["flash-attn2", "cuda", "sinks", "sinks", "bf16"]
    assert sinks2.status == "no" and sinks2.reasons == (
        "flash-attn2 does not support sinks (flash_attn_func has no attention-sink parameter (it takes softcap and alibi_slopes))",)
    assert cells["flash-attn3", "cuda", "softcap", "softcap", "fp16"].status == "yes"
    assert cells["xformers", "cuda", "softcap", "softcap", "fp16"].status == "no"
    # FP8: FA3's dense forward in e4m3, not its backward; FlashInfer reads an FP8 KV cache; an FP8 case has no softcap.
    assert cells["flash-attn3", "cuda", "plain", "plain", "fp8_e4m3"].status == "yes"
    fp8_backward = cells["flash-attn3", "cuda", "backward", "backward", "fp8_e4m3"]
    assert fp8_backward.status == "no" and any("FP8 path is the dense forward" in r for r in fp8_backward.reasons)
    assert cells["flashinfer", "cuda", "kv_dtype", "fp8_e4m3", "bf16"].status == "yes"
    no_case = cells["flash-attn3", "cuda", "softcap", "softcap", "fp8_e4m3"]
    assert no_case.status == "n/a" and "an FP8 case has no softcap" in no_case.reasons[0]
    # Paged MLA: FlashMLA in its 64-token pages, FlashInfer's MLA wrapper; both refuse a dense batch, saying so.
    for name in ("flashmla", "flashinfer-mla"):
        paged = cells[name, "cuda", "layout", "paged", "bf16"]
        assert paged.status == "yes" and "-mla" in paged.case_id, paged
        assert f"{name} does not take dense (rectangular) batches (it takes: paged)" in cells[name, "cuda", "plain", "plain", "bf16"].reasons
    # Varlen (packed) backward, deterministic: FlashAttention's; a paged cache has none, for any backend.
    assert cells["flash-attn2", "cuda", "ragged backward", "packed", "bf16"].status == "yes"
    assert cells["flash-attn2", "cuda", "deterministic", "deterministic", "bf16"].status == "yes"
    paged_training = cells["naive", "cpu", "ragged backward", "paged", "fp32"]
    assert paged_training.status == "no" and "a paged KV cache serves decoding" in paged_training.reasons[0]
    # Every backend has a cell for each row, dtype and device it declares.
    for name in GPU_BACKENDS:
        devices = load_registry(plugins=False).get(name).devices
        assert sum(1 for key in cells if key[0] == name) == len(devices) * len(matrix_rows()) * len(DTYPES)


def test_the_text_numbers_each_reason_once_under_its_backend(cells):
    matrix = capability_matrix(load_registry(plugins=False), names=["flash-attn2"], availability=False)
    text = render(matrix, availability=False)
    assert text.splitlines()[0] == "flash-attn2 (flash-attn)"
    sinks_line = next(line for line in text.splitlines() if line.strip().startswith("sinks "))
    number = sinks_line.split()[4].lstrip("✗")  # the bf16 column
    assert f"  ✗{number} flash-attn2 does not support sinks (flash_attn_func has no attention-sink parameter" in text
    assert text.count("does not support sinks") == 1


@pytest.mark.slow  # every registered backend, flex and naive-compiled's compiler probe included: seconds
def test_backends_matrix_lists_every_registered_backend_with_its_cells(capsys):
    assert main(["backends", "--matrix", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in listed] == load_registry().names()
    for row in listed:
        assert isinstance(row["available"], bool) and (row["available"] or row["unavailable_reason"])
        assert len(row["cells"]) == len(row["devices"]) * len(matrix_rows()) * len(DTYPES), row["name"]
        assert all(cell["reasons"] for cell in row["cells"] if cell["status"] != "yes"), row["name"]
    assert main(["backends", "--matrix"]) == 0
    text = capsys.readouterr().out
    assert all(f"{name} (" in text for name in load_registry().names())


@pytest.mark.slow  # the whole matrix of the built-in backends: seconds
def test_the_backends_page_is_the_matrix_the_code_makes_now(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the page is what a machine without CUDA answers")
    assert (ROOT / gen_docs.BACKENDS_PAGE).read_text() == gen_docs.backends_markdown(), "run `python scripts/gen_docs.py`"
    assert gen_docs.main(["--check"]) == 0
    assert "torch 2." not in (ROOT / gen_docs.BACKENDS_PAGE).read_text()  # no version the page would go stale with


def test_a_run_folder_holds_its_backends_matrix_and_the_report_shows_it(tmp_path):
    from harness.report.sections import _capability_matrix
    from harness.run.rundir import RUN_FILES

    registry = load_registry(plugins=False)
    text = render(capability_matrix(registry, names=["naive", "sdpa"], availability=False), availability=False)
    (tmp_path / MATRIX_FILE).write_text(text)
    shown = _capability_matrix(tmp_path)
    assert shown.startswith("<details>") and "naive (eager)" in shown and "sdpa does not support softcap" in shown
    assert _capability_matrix(tmp_path / "absent") == ""
    assert MATRIX_FILE in RUN_FILES  # `--force` removes it with the run
