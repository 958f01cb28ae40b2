"""`attnbench check` and the suites' agreement module: pass on the CPU backends, fail naming the case for each wrong one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main
from tests.cli_runs import attnbench, attnbench_in_process

ROOT = Path(__file__).resolve().parents[1]
WRONG = "tests.wrong_backends:add_all"
CPU_BACKENDS = "naive,sdpa,sdpa-math,sdpa-flash"

TINY = """
name = "tiny"
device = "cpu"
[[grid]]
B = [2]
S = [16]
H = [4]
H_kv = ["H", 2, 1]
d_k = [16]
dtype = ["fp32", "fp16", "bf16"]
causal = [false, true]
padding = [false, true]

[[grid]]
B = [1]
S = [16]
H = [4]
H_kv = [2]
d_k = [16]
d_v = [24]
dtype = ["fp32"]
mode = ["fwd_bwd"]
"""


pytestmark = pytest.mark.usefixtures("one_thread", "outside_xdist")  # its pytest route is its own pytest, no xdist worker


@pytest.fixture
def tiny(tmp_path) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return str(path)


@pytest.fixture
def wrong(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_BACKENDS", WRONG)


def check(capsys, *args: str) -> tuple[int, str]:
    """`attnbench check ARGS` in process: its exit status and all it printed (stdout, then stderr)."""
    code, out, err = attnbench_in_process(["check", *args], capsys)
    return code, out + err


def failed_cases(output: str, backend: str) -> set[str]:
    return set(re.findall(rf"^FAILED (\S+) \[{re.escape(backend)}\]", output, flags=re.M))


def rows(output: str, backend: str) -> dict[str, str]:
    """case id → verdict column for one backend's table rows."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[1] == backend and parts[0].startswith("B"):
            found[parts[0]] = parts[4]
    return found


def test_cpu_backends_pass_on_a_tiny_suite(capsys, tiny):
    code, out = check(capsys, "--suite", tiny, "--backends", CPU_BACKENDS)
    assert code == 0, out
    assert out.splitlines()[0].split() == ["case", "backend", "max_abs_err", "bound", "agree", "note"]
    for backend in CPU_BACKENDS.split(","):
        verdicts = rows(out, backend)
        assert len(verdicts) == 37, backend  # 36 cases of grid 1, one of grid 2
        assert set(verdicts.values()) <= {"yes", "unsupported"}
    assert "FAILED" not in out


def test_unsupported_and_unavailable_are_listed_not_failures(capsys, tiny):
    code, out = check(capsys, "--suite", tiny, "--backends", "sdpa-flash,sdpa-efficient")
    assert code == 0, out
    assert "sdpa-efficient: unavailable, not checked" in out
    # The CPU flash kernel cannot serve d_v ≠ d_k: listed as unsupported with torch's reason.
    assert rows(out, "sdpa-flash")["B1-Sq16-Skv16-H4-Hkv2-dk16-dv24-fp32-fwd_bwd"] == "unsupported"


def test_wrong_gqa_fails_naming_exactly_the_gqa_cases(capsys, tiny, wrong):
    code, out = check(capsys, "--suite", tiny, "--backends", "wrong-gqa")
    assert code == 1
    named = failed_cases(out, "wrong-gqa")
    verdicts = rows(out, "wrong-gqa")
    assert named and named == {c for c in verdicts if "-Hkv2-" in c}
    assert all(v == "yes" for c, v in verdicts.items() if "-Hkv2-" not in c)  # MHA and MQA: repeat is harmless


def test_leaked_mask_fails_naming_the_masked_cases(capsys, tiny, wrong):
    code, out = check(capsys, "--suite", tiny, "--backends", "wrong-mask")
    assert code == 1
    named = failed_cases(out, "wrong-mask")
    causal = {c for c in rows(out, "wrong-mask") if "-causal" in c}
    assert causal and causal <= named
    assert not {c for c in named if "-causal" not in c and "-pad" not in c}


def test_wrong_scale_fails_naming_every_fp32_and_fp16_case(capsys, tiny, wrong):
    code, out = check(capsys, "--suite", tiny, "--backends", "wrong-scale")
    assert code == 1
    named = failed_cases(out, "wrong-scale")
    precise = {c for c in rows(out, "wrong-scale") if "-fp32" in c or "-fp16" in c}
    assert precise and precise <= named


def test_unwritten_output_fails(capsys, tiny, wrong):
    code, out = check(capsys, "--suite", tiny, "--backends", "wrong-unwritten", "--dtype", "bf16")
    assert code == 1
    assert "non-finite output elements" in out
    assert len(failed_cases(out, "wrong-unwritten")) == 12


def test_dtype_filter_and_bf16_resolution_note(capsys, tiny):
    code, out = check(capsys, "--suite", tiny, "--backends", "naive", "--dtype", "bf16")
    assert code == 0
    assert set(rows(out, "naive")) and all("-bf16" in c for c in rows(out, "naive"))
    assert "cannot resolve errors near 1 %" in out


def test_default_grid_without_a_suite(capsys):
    code, out = check(capsys, "--backends", "sdpa", "--dtype", "fp32", "--mode", "fwd")
    assert code == 0, out
    ids = set(rows(out, "sdpa"))
    assert any("-Sq1-" in c for c in ids) and any("-win" in c for c in ids) and any("Hkv1" in c for c in ids)


@pytest.mark.parametrize("args, message", [
    (["--backends", "no-such-backend"], "unknown backend"),
    (["--suite", "no-such-suite"], "unknown suite"),
    (["--backends", "naive", "--dtype", "fp12"], "unknown dtype"),
    (["--backends", "naive", "--only", "nothing-matches-this"], "matches no"),
])
def test_user_mistakes_exit_2(capsys, args, message):
    code, out = check(capsys, *args)
    assert code == 2 and message in out


def _env() -> dict[str, str]:
    return {**os.environ, "ATTNBENCH_BACKENDS": WRONG, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.e2e
def test_the_installed_command_exits_1_and_names_the_case(tiny):
    """The real process: exit status 1 and the failing case on stdout."""
    proc = attnbench(["check", "--suite", tiny, "--backends", "naive,wrong-gqa", "--only", "Hkv2-dk16-fp32-causal"], _env(), timeout_s=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED B2-Sq16-Skv16-H4-Hkv2-dk16-fp32-causal [wrong-gqa]" in proc.stdout
    assert "[naive]" not in "\n".join(line for line in proc.stdout.splitlines() if line.startswith("FAILED"))


@pytest.mark.e2e
def test_agreement_module_turns_disagreements_into_pytest_failures(tiny):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "suites" / "test_agreement.py"),
         "--attnbench-suite", tiny, "--attnbench-backends", "sdpa,wrong-gqa", "-k", "fp32"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    failed = set(re.findall(r"FAILED \S+::test_agreement\[(\S+)\]", out))
    assert failed == {"B2-Sq16-Skv16-H4-Hkv2-dk16-fp32-wrong-gqa", "B2-Sq16-Skv16-H4-Hkv2-dk16-fp32-causal-wrong-gqa",
                      "B2-Sq16-Skv16-H4-Hkv2-dk16-fp32-pad-wrong-gqa", "B2-Sq16-Skv16-H4-Hkv2-dk16-fp32-causal-pad-wrong-gqa",
                      "B1-Sq16-Skv16-H4-Hkv2-dk16-dv24-fp32-fwd_bwd-wrong-gqa"}, out
    assert re.search(r"\b21 passed\b", out), out  # 13 fp32 cases for sdpa, 8 MHA/MQA fp32 cases for wrong-gqa
