"""Each job the tests do again and again has one helper, in tests/cli_runs.py (issue: one home for each fact).

Read from the source's syntax, not by importing: a function of any other module in tests/ (test modules and helper
modules alike, at any depth: module level, in a class, nested in a function) named as one of the jobs' helpers, with or
without leading underscores, is a private copy of that job, and fails here. The names are each job's helper's own, and
those of the copies it replaced: a copy re-added under an old name is caught as well as one under the helper's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "cli_runs.py"

#: Each job → the shared helper's name (first), then the names its copies went by.
JOBS = {
    "write a TOML suite file for a test": ("write_suite", "suite_file", "write_suite_file"),
    "run the CLI in a subprocess": ("attnbench", "run_attnbench", "attnbench_subprocess"),
    "run the CLI in process, capturing its exit status and output": ("attnbench_in_process", "cli", "run_cli", "main_status"),
    "assert a one-line refusal (exit 2, one error line, no traceback)": ("assert_one_line_error", "refused", "one_line_error",
                                                                         "one_error_line"),
}
NAMES = {name: job for job, names in JOBS.items() for name in names}


def defined_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function a module defines, wherever it stands."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def copies(folder: Path, helpers: Path) -> list[str]:
    """`file:line def name (job)` for each function of a module in `folder` (but `helpers`) named as a job's helper."""
    found = []
    for path in sorted(folder.glob("*.py")):
        if path == helpers:
            continue
        for node in defined_functions(ast.parse(path.read_text(), str(path))):
            job = NAMES.get(node.name.lstrip("_"))
            if job:
                found.append(f"{path.name}:{node.lineno} def {node.name} ({job}: use tests/cli_runs.py's {JOBS[job][0]})")
    return found


@pytest.mark.slow
def test_no_module_of_the_tests_defines_its_own_copy_of_a_shared_helper():
    assert len(list(TESTS.glob("test_*.py"))) > 10  # the folder is read, not empty
    assert copies(TESTS, HELPERS) == []


def test_each_job_has_its_helper_defined_once_at_the_top_of_the_helper_module():
    tree = ast.parse(HELPERS.read_text(), str(HELPERS))
    top = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    for job, names in JOBS.items():
        assert top.count(names[0]) == 1, (job, names[0])


def test_a_copy_is_caught_under_the_helpers_name_an_old_name_and_at_any_depth(tmp_path):
    (tmp_path / "helpers.py").write_text("def write_suite(path):\n    pass\n")  # the helper module itself is the home
    (tmp_path / "test_a.py").write_text("def write_suite(path):\n    pass\n")
    (tmp_path / "test_b.py").write_text("def _one_line_error(capsys, code):\n    pass\n")
    (tmp_path / "test_c.py").write_text("class T:\n    def test_x(self):\n        def cli(*args):\n            pass\n")
    (tmp_path / "other.py").write_text("def _attnbench(*args):\n    pass\n")
    (tmp_path / "test_d.py").write_text("def write_suites_for_a_sweep(path):\n    pass\n\ndef check(capsys):\n    pass\n")
    found = copies(tmp_path, tmp_path / "helpers.py")
    assert [line.split(" (")[0] for line in found] == [
        "other.py:1 def _attnbench", "test_a.py:1 def write_suite", "test_b.py:1 def _one_line_error", "test_c.py:3 def cli"]
