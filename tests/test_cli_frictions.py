"""Small frictions of the command line (issue 48): a default database for `site`, dtype aliases, flags named as typed,
"did you mean" for a mistyped name, and `profile` with --threads and no negative overhead share."""

from __future__ import annotations

import pytest
import torch

from harness.backends.registry import load_registry
from harness.errors import UserError
from harness.profiling.profile import KernelStat, ProfileSummary
from harness.suite.case_values import DTYPES
from harness.suite.cases import canonical_dtype
from harness.suite.presets import PRESETS
from tests.cli_runs import attnbench_in_process, refused, write_suite

CASE_ID = "B1-Sq32-Skv32-H2-Hkv2-dk16-fp32"


def test_site_opens_the_default_database_the_other_database_commands_open(tmp_path, capsys, monkeypatch):
    """`site` without --db reads results/attnbench.sqlite, as `db list` and `regress` do: a missing one is their one-line refusal."""
    from harness.cli.history import DB_HELP
    from harness.history.database import DEFAULT_PATH

    monkeypatch.chdir(tmp_path)
    line = refused(capsys, ["site", "--out", "site"], [f"no results database at {DEFAULT_PATH}", "attnbench db add RUN"])
    assert line == refused(capsys, ["db", "list"])  # the very line `db list` gives
    assert str(DEFAULT_PATH) in DB_HELP and not (tmp_path / "results").exists()


@pytest.mark.parametrize("alias", [*DTYPES.values(), "float", "half", "torch.float16", "FLOAT16", "bf16"])
def test_check_dtype_takes_every_name_a_suite_file_takes(alias):
    """`check --dtype` spells a dtype as a suite file may: the canonical name, torch's name, float/half, any case."""
    from harness.cli.arguments import dtype_list

    assert dtype_list(alias) == [canonical_dtype(alias)]


def test_check_dtype_float16_checks_the_fp16_cases_of_a_suite(tmp_path, capsys):
    """The issue's command: a suite file with dtype float16, checked with --dtype float16, checks its fp16 case."""
    suite = write_suite(tmp_path / "half.toml", grid=["B = 1", "S = 16", "H = 2", "d_k = 16", 'dtype = ["float16", "fp32"]'])
    ran = attnbench_in_process(["check", "--suite", suite, "--backends", "naive", "--dtype", "float16"], capsys)
    assert ran.code == 0 and "1 pairs: 1 agree" in ran.out and "-fp16" in ran.out and "-fp32" not in ran.out, ran


def test_an_unknown_dtype_lists_every_name_it_could_have_been(capsys):
    """The refusal names the canonical names and each alias with what it stands for."""
    line = refused(capsys, ["check", "--dtype", "half16"], ["--dtype", "unknown dtype 'half16'"])
    assert all(name in line for name in DTYPES) and all(f"{torch_name} ({short})" in line for short, torch_name in DTYPES.items())
    assert "half (fp16)" in line and "float (fp32)" in line


@pytest.mark.parametrize("flag, value, dest", [("--H", "3", "H"), ("--H-kv", "3", "H_kv"), ("--d-k", "3", "d_k")])
def test_a_contradicting_head_flag_is_named_as_the_user_typed_it(flag, value, dest, capsys):
    """`recommend --model M --H 3` names `--H` (a flag the parser has), never `--h`."""
    from harness.cli.main import build_parser

    line = refused(capsys, ["recommend", "nowhere", "--model", "llama3-8b", flag, value], [f"{flag} {value} contradicts --model llama3-8b"])
    recommend = build_parser()._subparsers._group_actions[0].choices["recommend"]
    typed = line.split("error: ", 1)[1].split()[0]
    assert typed == flag and any(typed in action.option_strings and action.dest == dest for action in recommend._actions), line


@pytest.mark.parametrize("argv, meant", [
    (["run", "--suite", "quik"], "'quick'"),
    (["check", "--suite", "defualt"], "'default'"),
    (["run", "--suite", "quick", "--backends", "naive,sdpa-flsh"], "'sdpa-flash'"),
    (["check", "--backends", "SDPA"], "'sdpa'"),
    (["run", "--model", "llama3-450b"], "'llama3-405b'"),
    (["recommend", "nowhere", "--model", "mistral-7"], "'mistral-7b'"),
])
def test_a_mistyped_name_gets_a_did_you_mean(argv, meant, tmp_path, capsys):
    """A backend, suite or model name one typo away: the one-line refusal suggests the name meant, and still lists them all."""
    line = refused(capsys, [*argv, "--out", tmp_path] if argv[0] == "run" else argv, ["did you mean", meant])
    assert line.index("did you mean") < line.index(" are ")  # the suggestion first, then the listing


def test_the_suggestions_come_from_one_helper_and_stay_quiet_when_nothing_is_close():
    """Case alone is an exact suggestion; several close names are listed; a name far from all gets no suggestion."""
    backends = load_registry().names()
    assert "(did you mean 'sdpa'?)" in str(UserError.unknown("backend", "SDPA", backends, "known backends are …"))
    several = str(UserError.unknown("model", "llama3-70", PRESETS, "known models are …"))
    assert "did you mean 'llama3-70b'" in several and " or " in several
    assert "did you mean" not in str(UserError.unknown("suite", "zzzzzz", ["quick", "default"], "built-in suites are quick, default"))


def _summary(kernel_time_s: float) -> ProfileSummary:
    return ProfileSummary(device="cpu", steps=2, kernels=(KernelStat("aten::bmm", "matmul", 2.0, kernel_time_s, 1.0),),
                          kernel_time_s=kernel_time_s, kernels_per_step=2.0, category_time_s={"matmul": kernel_time_s},
                          top_kernel="aten::bmm", peak_memory_bytes=None, peak_memory_op=None)


def test_a_profiled_pass_slower_than_the_median_prints_no_negative_share():
    """Operators summing to more than the median (contention, profiler cost): the overhead is 'not measurable', never -100 %."""
    text = _summary(8e-3).format_table(4e-3)
    assert "not measurable" in text and "operators took 200.0% of it" in text and "-100.0%" not in text and "--threads" in text
    assert _summary(8e-3).record_columns(4e-3)["profile_gap_share"] == pytest.approx(-1.0)  # the record keeps it as measured
    assert "launch overhead and gaps 20.0%" in _summary(8e-3).format_table(10e-3)


def test_profile_refuses_a_thread_count_as_run_does(tmp_path, capsys):
    """`profile --threads 0` is run --threads' one-line refusal, before any folder is made."""
    refused(capsys, ["profile", CASE_ID, "--backend", "naive", "--threads", "0", "--out", tmp_path / "p"], ["--threads must be a whole number"])
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_profile_times_with_the_threads_given_and_gives_torch_its_count_back(tmp_path, capsys):
    """The pair is profiled on the threads asked for (said in its first line); torch's count is this process's again after."""
    before = torch.get_num_threads()
    asked = 1 if before != 1 else 2
    ran = attnbench_in_process(["profile", CASE_ID, "--backend", "naive", "--threads", asked, "--steps", "1", "--out", tmp_path], capsys)
    assert ran.code == 0, ran
    assert f"{CASE_ID} on naive (cpu, {asked} thread{'s' if asked > 1 else ''}): harness median" in ran.out.splitlines()[0], ran.out
    assert torch.get_num_threads() == before
