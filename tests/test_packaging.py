"""attnbench installs like a package: an SPDX license with its file, `--version`, a typed plugin surface, and a
`harness` of another distribution named at start instead of run or ending in a traceback."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import attnbench
import harness
from harness.cli.main import main
from harness.compat import tomllib
from tests.cli_runs import ROOT, assert_one_line_error

#: The surface a plugin author writes against (harness/py.typed promises its types): module -> classes and functions.
TYPED_SURFACE = {
    "harness/backends/base.py": ["Backend", "Prepared"],
    "harness/results/record.py": ["Record"],
    "harness/results/store.py": ["load_run"],
}


def pyproject() -> dict:
    """pyproject.toml, read."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression_with_its_file():
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "the attnbench authors" in text and "WITHOUT WARRANTY OF ANY KIND" in text
    assert "License :: " not in " ".join(project["classifiers"])  # PEP 639: the SPDX field replaces license classifiers


def test_the_command_and_the_typing_marker_are_shipped():
    config = pyproject()
    assert config["project"]["scripts"] == {"attnbench": "attnbench:main"}
    assert config["tool"]["setuptools"]["py-modules"] == ["attnbench"]
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["harness"]
    assert (ROOT / "harness" / "py.typed").is_file()


def test_version_prints_the_running_version(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"attnbench {harness.__version__}\n"


class _Distribution:
    """An installed attnbench's metadata whose files are at `root`."""

    def __init__(self, root: Path, version: str) -> None:
        self.root, self.version = root, version

    def locate_file(self, path: str) -> Path:
        return self.root / path


def test_the_version_is_the_installed_metadata_only_when_it_describes_this_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(metadata, "distribution", lambda name: _Distribution(ROOT, "9.8.7"))
    assert harness.running_version() == "9.8.7"  # a wheel's files are these: its metadata says the version
    monkeypatch.setattr(metadata, "distribution", lambda name: _Distribution(tmp_path, "9.8.7"))
    assert harness.running_version() == harness.__version__  # an install elsewhere (or editable) is not this copy

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    assert harness.running_version() == harness.__version__  # a checkout, never installed: pyproject's own source


def test_this_harness_is_attnbenchs_and_another_is_named(monkeypatch):
    assert attnbench.foreign_harness() is None
    other = type(sys)("harness")
    other.__file__ = "/elsewhere/site-packages/harness/__init__.py"
    monkeypatch.setitem(sys.modules, "harness", other)
    problem = attnbench.foreign_harness()
    assert problem is not None and "/elsewhere/site-packages/harness/__init__.py is not attnbench's" in problem


@pytest.mark.e2e
def test_the_command_refuses_in_one_line_when_another_harness_comes_first(tmp_path):
    shadow = tmp_path / "harness"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('"""Another project\'s test harness."""\n')
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-c", "import sys, attnbench; sys.exit(attnbench.main(['backends']))"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(done, f"{shadow / '__init__.py'} is not attnbench's", "remove it from PYTHONPATH")


def _unannotated(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    """The parameters (and `return`) of a function that have no annotation; `self`/`cls` of a method need none."""
    args = function.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]
    if method and params and params[0].arg in ("self", "cls"):
        params = params[1:]
    missing = [p.arg for p in params if p.annotation is None]
    return missing + (["return"] if function.returns is None and function.name != "__init__" else [])


def _surface_gaps() -> list[str]:
    """Every public function or method of TYPED_SURFACE with a parameter or return left unannotated."""
    gaps = []
    for relative, names in TYPED_SURFACE.items():
        tree = ast.parse((ROOT / relative).read_text())
        top = {node.name: node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
        for name in names:
            node = top[name]
            functions = [(node, False)] if isinstance(node, ast.FunctionDef) else [
                (f, True) for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (not f.name.startswith("_") or f.name == "__init__")]
            for function, method in functions:
                missing = _unannotated(function, method)
                if missing:
                    gaps.append(f"{relative}: {name}{'.' + function.name if method else ''}: {', '.join(missing)}")
    return gaps


def test_the_plugin_facing_surface_is_fully_annotated():
    """What py.typed promises: no mypy in the project's environment, so the annotations themselves are held complete."""
    assert _surface_gaps() == []


def test_the_annotation_check_finds_a_gap():
    function = ast.parse("def f(self, case, n: int):\n    pass\n").body[0]
    assert _unannotated(function, method=True) == ["case", "return"]
