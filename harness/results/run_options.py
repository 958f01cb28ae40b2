"""The options that shape a run's measurement, in one frozen type: what `run` is asked, what its manifest stores, and
what its workers, `--resume`, the pytest plugin and `repro` read back.

Each field says how it travels beyond the type in its metadata (an `Option`): the manifest key it is stored
under and the check its value passes on read, the `attnbench run` flag that sets it (the `--resume` clash
list and the CLI's conversion go through it), the pytest plugin's option, and the words `repro` writes for
it. A field added here is stored, read back, refused by `--resume` and repeated by `repro` with no edit elsewhere
(its flag still needs its line in the CLI's parser, which holds the help texts).

The manifest keeps the keys every attnbench wrote at its top level (`check`, `profile`, `traces`, `timer`,
`energy`, `cooldown_s`, `order`, `budget`, and `threads` since `run --threads`), so older run folders resume and
report, and older readers read newer folders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from harness.errors import UserError
from harness.results.field_checks import Check, _accepting, _boolean, _count, _object, _positive, optional
from harness.suite.budget import Budget, budget_from_fields

#: More threads than any machine this harness runs on has cores; a larger number is a typo.
MAX_THREADS = 1024


def check_threads(n: int | None) -> int | None:
    """`n` if it is a sane thread count (or None), else a UserError naming it."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise UserError(f"--threads must be a whole number from 1 to {MAX_THREADS}, not {n!r}")
    return n


#: `run --timer`'s choices, defined here (torch-free) for the manifest's check and harness.measure.timers alike.
TIMERS = ("events", "kernels", "graph")
#: The seed a run uses unless `--order-seed` says otherwise (fixed: two runs of one suite measure in one order).
DEFAULT_ORDER_SEED = 0
#: What the manifest calls the order's scheme (`manifest["order"]["scheme"]`; harness.run.order implements it).
ORDER_SCHEME = "seeded Latin-square blocks: within every len(backends) cases each backend runs once in each position"
#: `--cooldown auto` (or `--cooldown` alone) waits at most this long between pairs.
AUTO_MAX_S = 60.0
#: The metadata key of a RunOptions field's `Option`.
OPTION = "run_option"

_TIMER = _accepting(lambda v: isinstance(v, str) and v in TIMERS, f"one of {', '.join(TIMERS)} (run --timer)")
_THREADS = optional(_accepting(lambda v: not isinstance(v, bool) and isinstance(v, int) and 1 <= v <= MAX_THREADS,
                               f"a whole number from 1 to {MAX_THREADS} (run --threads)"))
_BUDGET = optional(_accepting(lambda v: isinstance(v, Budget), "a Budget"))


def parse_cooldown(text: str | None) -> float | None:
    """Seconds from `--cooldown` (`auto` → AUTO_MAX_S; a positive number; None → no cool-down); UserError otherwise."""
    if text is None:
        return None
    if text == "auto":
        return AUTO_MAX_S
    try:
        seconds = float(text)
    except ValueError:
        raise UserError(f"--cooldown takes 'auto' or a number of seconds, got {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise UserError(f"--cooldown takes a positive number of seconds, got {text!r}")
    return seconds


def flag_words(flag: str, value: Any) -> list[str]:
    """The words of `flag` that give `run` `value`: a switch alone when true, else the flag and the value."""
    if value is None or value is False:
        return []
    return [flag] if value is True else [flag, str(value)]


@dataclass(frozen=True)
class Option:
    """How one run option travels beyond its RunOptions field (the field's metadata under OPTION)."""

    #: The value's check: on the manifest's value as read (naming the file and key), and on the field as built.
    check: Check
    #: `attnbench run`'s flag; None: `run` has none (the budget is the suite's).
    flag: str | None = None
    #: The option's value from its flag's parsed value (argparse's or pytest's; None when not given means the default).
    from_flag: Callable[[Any], Any] = lambda value: value
    #: The words of `flag` that give `run` this value again, for `repro`; None: repro leaves the option out.
    words: Callable[[str, Any], list[str]] | None = flag_words
    #: The manifest key (None: the field's name), the value's JSON form, and the value from it (None: `check` alone).
    key: str | None = None
    dump: Callable[[Any], Any] = lambda value: value
    load: Callable[[Any, str, str], Any] | None = None
    #: The pytest plugin's `addoption` arguments for `--attnbench-<flag>` (None: the plugin has no such option).
    pytest: dict[str, Any] | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse gives `flag`."""
        return str(self.flag).lstrip("-").replace("-", "_")

    @property
    def pytest_flag(self) -> str:
        """The pytest plugin's name of the option."""
        return "--attnbench-" + str(self.flag).lstrip("-")


def _option(default: Any, **spec: Any) -> Any:
    return field(default=default, metadata={OPTION: Option(**spec)})


def _load_order(value: Any, where: str, key: str) -> int:
    # Folders made before the order was recorded have none: they were measured in the default order.
    if value is None:
        return DEFAULT_ORDER_SEED
    return _count(_object(value, where, key).get("seed", DEFAULT_ORDER_SEED), where, f"{key}.seed")


def _load_budget(value: Any, where: str, key: str) -> Budget | None:
    # None: a folder made before manifests held their budget, measured under its suite's (harness.run.manifest_pairs).
    return None if value is None else budget_from_fields(_object(value, where, key), f"{where}: field {key!r}")


@dataclass(frozen=True)
class RunOptions:
    """What shapes every pair's measurement in a run (beside its pairs): one value, from `run`'s flags or a manifest."""

    # The order of the fields is the order of repro's words: the valued ones before the switches.
    timer: str = _option("events", check=_TIMER, flag="--timer", pytest={
        "default": "events", "choices": TIMERS, "help": "what a sample is (harness.measure.timers)"})
    #: torch's intra-op CPU threads in each timing process; None: torch's default (the core count), each row records it.
    threads: int | None = _option(None, check=_THREADS, flag="--threads", from_flag=check_threads, pytest={
        "default": None, "type": int, "help": "torch's intra-op CPU threads while timing (default: torch's, the core count)"})
    check: bool = _option(True, check=_boolean, flag="--no-check", from_flag=lambda no_check: not no_check,
                          words=lambda flag, value: [] if value else [flag],
                          pytest={"action": "store_true", "help": "skip the agreement check"})
    energy: bool = _option(False, check=_boolean, flag="--energy", from_flag=bool, pytest={
        "action": "store_true", "help": "the energy phase per pair (harness.telemetry.energy)"})
    profile: bool = _option(False, check=_boolean, flag="--profile", from_flag=bool, pytest={
        "action": "store_true", "help": "one profiled pass per pair after its timed samples"})
    # The plugin's option names the traces' folder; the option itself is whether there are traces.
    traces: bool = _option(False, check=_boolean, flag="--traces", from_flag=bool, pytest={
        "default": None, "help": "with --attnbench-profile: folder for one Chrome trace per pair"})
    # Not in repro: a pair run again alone is its run's first, after nothing that heated the GPU.
    cooldown_s: float | None = _option(None, check=optional(_positive), flag="--cooldown", from_flag=parse_cooldown, words=None)
    # Not in repro: a pair alone has no order to seed.
    order_seed: int = _option(DEFAULT_ORDER_SEED, check=_count, flag="--order-seed", words=None, key="order",
                              dump=lambda seed: {"scheme": ORDER_SCHEME, "seed": seed}, load=_load_order)
    #: The Budget the pairs are measured under; None: the suite's (a new run's), or an older folder's suite's.
    #: Measure the rows left contended, suspect or throttled once more at the end of the sweep (harness.run.remeasure).
    # Not in repro: a pair run again alone is measured once.
    remeasure: bool = _option(True, check=_boolean, flag="--no-remeasure", from_flag=lambda no_remeasure: not no_remeasure, words=None)
    budget: Budget | None = _option(None, check=_BUDGET, words=None,
                                    dump=lambda budget: None if budget is None else dataclasses.asdict(budget), load=_load_budget)

    def __post_init__(self) -> None:
        for f, spec in options(type(self)):
            spec.check(getattr(self, f.name), "run options", spec.flag or f.name)
        if self.traces and not self.profile:  # the traces are the profiled steps'
            raise UserError("--traces goes with --profile")

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's keys for these options (the ones every attnbench wrote)."""
        return {spec.key or f.name: spec.dump(getattr(self, f.name)) for f, spec in options(type(self))}

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any], where: Any) -> "RunOptions":
        """The options a manifest's JSON object stores (a key it lacks: the default); UserError naming `where` and the key."""
        values = {}
        for f, spec in options(cls):
            key = spec.key or f.name
            if key in data:
                values[f.name] = (spec.load or spec.check)(data[key], str(where), key)
        return cls(**values)

    @classmethod
    def from_flags(cls, parsed: Mapping[str, Any]) -> "RunOptions":
        """The options from their flags' parsed values by field name (a value of None, or a field left out: the default)."""
        return cls(**{f.name: spec.from_flag(parsed[f.name]) for f, spec in options(cls)
                      if parsed.get(f.name) is not None})

    @classmethod
    def flag_values(cls, args: Any) -> dict[str, Any]:
        """Each flagged option's parsed value in `args` (argparse's namespace), by field name."""
        return {f.name: getattr(args, spec.dest) for f, spec in options(cls) if spec.flag is not None}

    @classmethod
    def given_flags(cls, args: Any) -> list[str]:
        """The flags `args` gives (a switch set, a value named): what `run --resume` refuses."""
        flags = {f.name: spec.flag for f, spec in options(cls)}
        return [str(flags[name]) for name, value in cls.flag_values(args).items() if value is not None and value is not False]

    def run_words(self) -> list[str]:
        """The words of `attnbench run` that measure pairs under these options again (repro)."""
        return [word for f, spec in options(type(self)) if spec.flag is not None and spec.words is not None
                for word in spec.words(spec.flag, getattr(self, f.name))]


def options(cls: type = RunOptions) -> Iterator[tuple[dataclasses.Field, Option]]:
    """Each field of `cls` (RunOptions, or a subclass) with its Option, in field order."""
    for f in dataclasses.fields(cls):
        yield f, f.metadata[OPTION]
