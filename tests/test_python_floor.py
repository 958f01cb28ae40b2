"""The declared Python floor is true: pyproject's requires-python is 3.10, and nothing in the code needs more.

No 3.10 interpreter is at hand here (nor on CI), so the floor is held by reading the source: every module parses with
3.10's grammar (`ast.parse(feature_version=(3, 10))`, which rejects `except*` and what came later), and none uses a
standard-library module or name added in 3.11 or later, except through harness.compat, whose 3.10 branch is run here.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from pathlib import Path

import pytest

from harness.compat import tomllib
from tests.cli_runs import ROOT

FLOOR = (3, 10)
#: Standard-library modules new in 3.11 or later.
NEW_MODULES = {"tomllib", "wsgiref.types"}
#: module -> names it gained in 3.11 or later (what `from module import name` or `module.name` may not use).
NEW_NAMES = {
    "typing": {"Self", "Never", "LiteralString", "assert_never", "assert_type", "reveal_type", "Required", "NotRequired",
               "dataclass_transform", "TypeVarTuple", "Unpack", "override", "TypeAliasType", "get_overloads", "clear_overloads"},
    "enum": {"StrEnum", "ReprEnum", "EnumCheck", "FlagBoundary", "verify", "member", "nonmember", "global_enum", "property"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "operator": {"call"},
    "math": {"cbrt", "exp2"},
    "itertools": {"batched"},
    "logging": {"getLevelNamesMapping"},
    "inspect": {"getmembers_static", "markcoroutinefunction", "BufferFlags"},
    "sys": {"exception", "activate_stack_trampoline", "monitoring"},
    "re": {"NOFLAG"},
    "warnings": {"deprecated"},
}
#: Builtins new in 3.11.
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
#: The one module that may name a new module: behind a version check, with its 3.10 fallback.
COMPAT = ROOT / "harness" / "compat.py"


def sources() -> list[Path]:
    """Every Python file of the project: the package, the entry point, the tests, the scripts, the suites."""
    files = [ROOT / "attnbench.py", ROOT / "conftest.py"]
    for folder in ("harness", "tests", "scripts", "suites"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if f.is_file()]


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A project file's syntax tree under the floor's grammar (a SyntaxError when it needs a later one); read once a session."""
    return ast.parse(path.read_text(), str(path), feature_version=FLOOR)


def newer_than_floor(tree: ast.Module) -> list[str]:
    """What a module uses of Python 3.11+'s standard library, each as `line: what`."""
    aliases: dict[str, str] = {}  # local name -> module, for `import datetime as dt`
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
                if alias.name in NEW_MODULES:
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if module in NEW_MODULES:
                found.append(f"{node.lineno}: from {module} import ...")
            found += [f"{node.lineno}: from {module} import {a.name}" for a in node.names if a.name in NEW_NAMES.get(module, ())]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and node.attr in NEW_NAMES.get(module, ()):
                found.append(f"{node.lineno}: {module}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            found.append(f"{node.lineno}: {node.id}")
    return found


def test_pyproject_declares_the_floor_and_the_toml_fallback_it_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert "tomli>=1.1; python_version < '3.11'" in project["dependencies"]
    assert "Programming Language :: Python :: 3.10" in project["classifiers"]


@pytest.mark.slow  # ~2.7 CPU s to parse every file of the project (once for both tests)
def test_every_module_parses_with_the_floor_grammar():
    files = sources()
    assert len(files) > 100 and COMPAT in files  # the folders are read
    broken = []
    for path in files:
        try:
            parsed(path)
        except SyntaxError as exc:
            broken.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert broken == []


@pytest.mark.slow
def test_no_module_uses_the_standard_library_of_a_later_python():
    used = {str(path.relative_to(ROOT)): found for path in sources() if path != COMPAT
            for found in [newer_than_floor(parsed(path))] if found}
    assert used == {}


@pytest.mark.parametrize("source, found", [
    ("import tomllib\n", ["1: import tomllib"]),
    ("from enum import StrEnum\n", ["1: from enum import StrEnum"]),
    ("import datetime as dt\nx = dt.UTC\n", ["2: datetime.UTC"]),
    ("import typing\ndef f() -> typing.Self: ...\n", ["2: typing.Self"]),
    ("raise ExceptionGroup('x', [])\n", ["1: ExceptionGroup"]),
    ("import datetime\nx = datetime.timezone.utc\nfrom typing import Optional\n", []),
])
def test_the_scan_finds_what_is_newer_and_only_that(source, found):
    assert newer_than_floor(ast.parse(source)) == found


def test_on_python_3_10_toml_is_read_by_tomli(monkeypatch):
    """harness.compat's other branch, run: with the version of 3.10 it takes `tomli`, the package pyproject requires there."""
    tomli = types.ModuleType("tomli")
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    monkeypatch.setattr(sys, "version_info", (3, 10, 12, "final", 0))
    namespace: dict = {"__name__": "harness.compat_on_3_10"}
    exec(compile(COMPAT.read_text(), str(COMPAT), "exec"), namespace)  # noqa: S102 - the project's own module, run as 3.10 would
    assert namespace["tomllib"] is tomli
