"""FlashInfer's installed source read with ast: its wrappers' real signatures, and what the adapter hands them.

flashinfer cannot import without CUDA, so its source is read instead. Shared by tests/test_flashinfer_library.py and
tests/test_gpu_variants.py (a helper module: a test module imported twice is two copies).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import types
from pathlib import Path

import pytest

import harness.backends.flashinfer.adapter as fi

_SPEC = importlib.util.find_spec("flashinfer")
SOURCE = Path(_SPEC.origin).parent if _SPEC is not None and _SPEC.origin else None
NO_SOURCE = "flashinfer-python's source is not installed (CI: pip install flashinfer-python==0.7.2.post1 --no-deps)"
needs_source = pytest.mark.skipif(SOURCE is None or not (SOURCE / "__init__.py").is_file(), reason=NO_SOURCE)
P = inspect.Parameter
SELF = object()


def class_node(name: str) -> ast.ClassDef:
    """The class `flashinfer.<name>` as written, found by following flashinfer/__init__.py's relative imports."""
    path = SOURCE / "__init__.py"
    for _ in range(8):
        tree = ast.parse(path.read_text(), str(path))
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        if found:
            return found[-1]
        origin = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and any(a.name == name for a in n.names))
        target = path.parent.parents[origin.level - 2] if origin.level > 1 else path.parent
        target = target.joinpath(*(origin.module or "").split("."))
        path = target / "__init__.py" if target.is_dir() else target.with_suffix(".py")
    raise AssertionError(f"flashinfer.{name} not found in its source")


def method_node(cls: str, method: str) -> ast.FunctionDef:
    """The method's real definition (the last one not marked @overload)."""
    overload = lambda d: (d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "overload"  # noqa: E731
    defs = [n for n in class_node(cls).body if isinstance(n, ast.FunctionDef) and n.name == method
            and not any(overload(d) for d in n.decorator_list)]
    assert defs, f"{cls}.{method} not in flashinfer's source"
    return defs[-1]


def signature(fn: ast.FunctionDef) -> inspect.Signature:
    """An inspect.Signature from the ast.arguments: positional-only, positional, defaults, *args, keyword-only, **kwargs."""
    a = fn.args
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults = [P.empty] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    params = [P(x.arg, kind, default=d) for (x, kind), d in zip(positional, defaults)]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    params += [P(x.arg, P.KEYWORD_ONLY, default=P.empty if d is None else ast.unparse(d)) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def forwards(fn: ast.FunctionDef, kwarg: str) -> list[ast.Call]:
    """The calls `self.<method>(…, **kwarg)` through which fn hands its **kwarg on."""
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
            and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwarg for k in n.keywords)]


def bind(cls: str, method: str, args: tuple, kwargs: dict) -> list[str]:
    """Bind a call to the real method (TypeError if it does not fit) and to what its **kwargs reach; the methods bound."""
    fn = method_node(cls, method)
    sig = signature(fn)
    bound = sig.bind(SELF, *args, **kwargs)
    reached = [method]
    kwarg = next((p.name for p in sig.parameters.values() if p.kind is P.VAR_KEYWORD), None)
    if kwarg and bound.arguments.get(kwarg):
        # A **kwargs takes any keyword: what checks it is the method it is passed on to, bound as plan() calls it.
        calls = forwards(fn, kwarg)
        assert calls, f"{cls}.{method} takes **{kwarg} and passes it to no method this test can follow"
        for call in calls:
            assert all(isinstance(a, ast.Name) for a in call.args), ast.unparse(call)
            on = [bound.arguments[a.id] for a in call.args]
            named = {k.arg: bound.arguments[k.value.id] for k in call.keywords if k.arg is not None}
            reached += bind(cls, call.func.attr, tuple(on), {**named, **bound.arguments[kwarg]})
    return reached


def fake_flashinfer(log: list):
    """A `flashinfer` module whose three wrappers record every call (name, method, args, kwargs) and run nothing."""
    def wrapper_class(name):
        def record(method):
            def call(self, *args, **kwargs):
                log.append((name, method, args, kwargs))
            return call
        return type(name, (), {m: record(m) for m in ("__init__", "plan", "run")})
    return types.SimpleNamespace(**{n: wrapper_class(n) for n in (fi.RAGGED_PREFILL, fi.PAGED_PREFILL, fi.PAGED_DECODE)})


def prepared_calls(monkeypatch, case, inputs):
    """What FlashinferBackend.prepare (and one timed call) hands the library for a case: the calls, and the Prepared."""
    log: list = []
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer(log))
    prepared = fi.FlashinferBackend().prepare(case, inputs)
    prepared.fn()
    return log, prepared
