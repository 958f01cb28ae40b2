"""The registry of backends: built-ins registered by decorator, third-party ones by entry point."""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Iterable, Iterator

from harness.backends.base import Backend
from harness.errors import UserError

ENTRY_POINT_GROUP = "attnbench.backends"
#: Environment variable naming extra backends, `module:attr[,module:attr…]` (tests, local experiments, workers).
ENV_VAR = "ATTNBENCH_BACKENDS"

#: Modules that define the built-in backends; importing one registers its classes in BUILTINS.
BUILTIN_MODULES = (
    "harness.backends.pytorch.naive", "harness.backends.pytorch.sdpa", "harness.backends.pytorch.projections",
    "harness.backends.pytorch.compiled", "harness.backends.pytorch.flex", "harness.backends.xformers.adapter",
    "harness.backends.flashattention.adapter", "harness.backends.flashinfer.adapter", "harness.backends.pytorch.mla",
    "harness.backends.pytorch.eager_fp8", "harness.backends.flashmla.adapter", "harness.backends.flashinfer.mla",
    "harness.backends.pytorch.layer",
)


@dataclass(frozen=True)
class BackendInfo:
    """A listing row: a backend's name, family, availability, reason and version."""

    name: str
    family: str
    available: bool
    reason: str | None
    version: str | None
    description: str = ""


class Registry:
    """An explicit collection of backends by name; build one with `load_registry()` or by hand in tests."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._broken: dict[str, str] = {}
        #: While `load_registry` loads one route (built-in, an entry point, an ATTNBENCH_BACKENDS entry): its words and
        #: the `module:attr` a conflict is listed under; None for adds by hand, where a duplicate name is an error.
        self._route: tuple[str, str] | None = None
        self._routes: dict[str, str] = {}

    @contextlib.contextmanager
    def route(self, words: str, label: str) -> Iterator[None]:
        """Adds inside are from one loading route: a backend found again is kept once, another claiming a taken name listed unusable."""
        self._route = (words, label)
        try:
            yield
        finally:
            self._route = None

    def add(self, backend: Backend) -> None:
        """Add a backend instance; a name or family that is not a string is an error, and so is a duplicate name added by hand.

        Inside `route` (plugins being loaded) a duplicate is not raised: see `_add_again`.
        """
        if not isinstance(backend.name, str) or not backend.name:
            raise PluginFieldError(f"{type(backend).__name__}.name is {backend.name!r}, expected a non-empty string")
        if not isinstance(backend.family, str):
            raise PluginFieldError(f"{type(backend).__name__}.family is {backend.family!r}, expected a string")
        if backend.name in self._backends or backend.name in self._broken:
            if self._route is None:
                raise ValueError(f"backend {backend.name!r} is registered twice")
            return self._add_again(backend)
        self._backends[backend.name] = backend
        if self._route is not None:
            self._routes[backend.name] = f"{self._route[0]} ({_qualname(type(backend))})"

    def _add_again(self, backend: Backend) -> None:
        """A name found by a second route: the same class is the same backend, kept once; another class is listed unusable."""
        words, label = self._route  # type: ignore[misc]
        first = self._backends.get(backend.name)
        if first is not None and type(first) is type(backend):
            return
        before = self._routes.get(backend.name, "an earlier plugin that failed to load")
        if label in self:
            label = f"{label} [{backend.name}]"
        self.add_broken(label, f"backend name {backend.name!r} is taken by {before}; {words} gives another backend under it "
                               f"({_qualname(type(backend))}), not loaded: rename one of them")

    def add_broken(self, name: str, reason: str) -> None:
        """Record a plugin that failed to load: listed as unavailable, never run."""
        self._broken[name] = reason

    def demote(self, name: str, reason: str) -> None:
        """Move a loaded backend to the broken ones (a plugin found unusable after it loaded), keeping its place in `names()`."""
        self._backends.pop(name)
        self._broken[name] = reason

    def get(self, name: str) -> Backend:
        """The backend called `name`, or a UserError that lists the known names."""
        if name in self._backends:
            return self._backends[name]
        if name in self._broken:
            raise UserError(f"backend {name!r} failed to load: {self._broken[name]}")
        raise UserError.unknown("backend", name, self.names(), f"known backends are {', '.join(self.names())}")

    def failures(self) -> dict[str, str]:
        """Each plugin that failed to load (or was found unusable), by the name it is listed under, with its reason."""
        return dict(self._broken)

    def names(self) -> list[str]:
        """Every registered name, loaded or broken, in registration order."""
        return [*self._backends, *self._broken]

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def __contains__(self, name: object) -> bool:
        return name in self._backends or name in self._broken

    def describe(self) -> list[BackendInfo]:
        """One listing row per backend, with its availability and reason."""
        rows = []
        for backend in self._backends.values():
            try:
                reason = backend.available()
            except Exception as exc:  # a probe that crashes means unavailable, with the error as reason
                reason = f"availability check failed: {type(exc).__name__}: {exc}"
            try:
                version = checked_version(backend) if reason is None else None
            except PluginFieldError as exc:  # a plugin's version() of the wrong type makes it unusable, not the listing
                reason, version = str(exc), None
            except Exception:
                version = None
            rows.append(BackendInfo(backend.name, backend.family, reason is None, reason, version, backend.description))
        for name, reason in self._broken.items():
            rows.append(BackendInfo(name, "plugin", False, reason, None))
        return rows


class UnloadedPlugin(Backend):
    """Stands for a backend plugin that failed to load, so that its pairs still get `unsupported` rows."""

    family = "plugin"

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason  # type: ignore[misc]

    def version(self) -> str:
        """Unknown: the plugin never loaded."""
        return ""

    def available(self) -> str | None:
        """Why the plugin cannot run: its load error."""
        return self.reason


class PluginFieldError(TypeError):
    """A backend's declared field (name, family, version()) has the wrong type: the backend cannot be listed or recorded."""


def checked_version(backend: Backend) -> str | None:
    """`backend.version()`, or PluginFieldError when it is not a string or None (a record stores it as text)."""
    version = backend.version()
    if version is not None and not isinstance(version, str):
        raise PluginFieldError(f"{type(backend).__name__}.version() returned {version!r}, expected a string or None")
    return version


def _qualname(cls: type) -> str:
    """`module.Class`: how a route's backend is named when two claim one name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _load_error(exc: BaseException) -> str:
    """The reason a plugin failed to load; Ctrl-C is the user's, never a plugin's failure."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


#: Built-in backend classes, filled by `register` in BUILTIN_MODULES when they are imported. Classes, not
#: instances: each registry gets its own instances, so a backend's state (a probed kernel, a compiled
#: callable) never leaks from one registry (one test, one command) into another.
BUILTIN_CLASSES: list[type[Backend]] = []


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator for the built-in backends: `load_registry` instantiates the class afresh for each registry."""
    if cls not in BUILTIN_CLASSES:
        BUILTIN_CLASSES.append(cls)
    return cls


def load_registry(*, plugins: bool = True, extra: Iterable[Callable[[Registry], None]] = ()) -> Registry:
    """A fresh registry holding the built-ins and, if `plugins`, every `attnbench.backends` entry point.

    A plugin that raises on import is listed as unavailable with its error instead of stopping anything.
    An entry point may name a Backend subclass or a function that takes the registry and adds to it;
    so may each `module:attr` of the ATTNBENCH_BACKENDS variable (listed under that spec if it fails).
    """
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    registry = Registry()
    with registry.route("the built-in backend", "harness"):
        for module in BUILTIN_MODULES:  # in this order, whatever order they were first imported in
            for cls in BUILTIN_CLASSES:
                if cls.__module__ == module:
                    registry.add(cls())
    if plugins:
        builtin = set(registry.names())
        loaded: list[object] = []  # a target found by two routes (an entry point and the variable, or named twice) loads once
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                with registry.route(f"entry point {ep.name} = {ep.value}", ep.value):
                    target = ep.load()
                    if not any(target is seen for seen in loaded):
                        loaded.append(target)
                        _add_target(registry, target)
            except BaseException as exc:  # SystemExit too: a plugin that exits at import must not end the listing
                reason = _load_error(exc)
                if ep.name not in registry:
                    registry.add_broken(ep.name, f"plugin {ep.value} failed to load: {reason}")
        for spec in filter(None, (s.strip() for s in os.environ.get(ENV_VAR, "").split(","))):
            _load_spec(registry, spec, loaded)
        _demote_bad_versions(registry, builtin)
    for hook in extra:
        hook(registry)
    return registry


def _add_target(registry: Registry, target: object) -> None:
    """Add what an entry point or a `module:attr` names: a Backend subclass (instantiated) or a function taking the registry."""
    if isinstance(target, type) and issubclass(target, Backend):
        registry.add(target())
    elif callable(target):
        target(registry)
    else:
        raise TypeError(f"{target!r} is neither a Backend subclass nor a function taking the registry")


def _load_spec(registry: Registry, spec: str, loaded: list[object]) -> None:
    """Add the backend(s) named by one `module:attr` of ATTNBENCH_BACKENDS (unless `loaded` holds it); a failure is listed under `spec`."""
    try:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"expected module:attr, got {spec!r}")
        target = getattr(importlib.import_module(module_name), attr)
        if any(target is seen for seen in loaded):
            return
        if not callable(target):
            raise TypeError(f"{attr} is neither a Backend subclass nor a function taking the registry")
        loaded.append(target)
        with registry.route(f"{ENV_VAR} entry {spec}", spec):
            _add_target(registry, target)
    except BaseException as exc:  # a broken plugin is data (SystemExit at import included): listed unavailable, never fatal
        reason = _load_error(exc)
        if spec not in registry:
            registry.add_broken(spec, f"{ENV_VAR} entry {spec} failed to load: {reason}")


def _demote_bad_versions(registry: Registry, builtin: set[str]) -> None:
    """Plugins whose version() returns something other than text are listed unavailable, as a plugin that fails to load is.

    A version() that raises is left alone: an unavailable backend may not be able to say its version.
    """
    for backend in list(registry):
        if backend.name in builtin:
            continue
        try:
            checked_version(backend)
        except PluginFieldError as exc:
            registry.demote(backend.name, f"plugin {backend.name} is unusable: {exc}")
        except Exception:  # noqa: BLE001 - see the docstring
            pass
