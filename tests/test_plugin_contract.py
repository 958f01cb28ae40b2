"""The plugin contract as the README states it (docs/plugins.md in full): its example plugin runs, found by any route.

The README's example is the code these tests load (extracted from the fenced block of "## Backends and plugins"), so
the documentation and the contract cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import types
from pathlib import Path

import pytest

from harness.backends.base import Backend, Prepared
from harness.backends.registry import ENTRY_POINT_GROUP, ENV_VAR, load_registry
from harness.execution.execute import execute
from harness.results.record import Status
from harness.suite.cases import Case
from tests.cli_runs import ROOT, attnbench, rows

README = ROOT / "README.md"
#: The page the pytest route's options are documented on, beside its example (moved there from the README).
USAGE = ROOT / "docs" / "usage.md"
#: Two quick cases (GQA, H_kv 2 of 8 heads, causal and not): small enough for two shared cores.
ONLY = "B1-Sq128-Skv128-H8-Hkv2-dk64-fp32"


def section(title: str, page: Path = README) -> str:
    """The text of `page`'s section `title` (a `##`/`###` heading's own line), up to the next heading of its level or above."""
    level = len(title.split(" ", 1)[0])
    lines, inside, fenced = [], False, False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")  # a `# comment` in a code block is no heading
        heading = not fenced and re.match(r"#+ ", line)
        if heading and inside and len(heading.group().strip()) <= level:
            break
        inside = inside or line == title
        if inside:
            lines.append(line)
    assert lines, f"{page.name} has no section {title!r}"
    return "\n".join(lines) + "\n"


def readme_plugin() -> str:
    """The source of the plugin README.md shows (its one python block of "## Backends and plugins")."""
    blocks = re.findall(r"```python\n(.*?)```", section("## Backends and plugins"), re.S)
    assert len(blocks) == 1, "the section shows one whole plugin"
    return blocks[0]


def plugin_class(source: str, attr: str = "MyAttention") -> type[Backend]:
    """The Backend class a plugin's source defines, loaded as a module of its own."""
    module = types.ModuleType("readme_plugin")
    exec(compile(source, "README.md", "exec"), module.__dict__)
    return getattr(module, attr)


def user_env(folder: Path, spec: str) -> dict[str, str]:
    """The environment of a user who saved a plugin in `folder` and named it in ATTNBENCH_BACKENDS."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "ATTNBENCH_TEST_LOG")}
    return {**env, ENV_VAR: spec, "PYTHONPATH": f"{folder}:{ROOT}", "OMP_NUM_THREADS": "1"}


def run_quick(tmp_path: Path, env: dict[str, str]) -> list[dict]:
    """`attnbench run --suite quick --backends my-attention --only ONLY` on the CPU, as a user types it; its rows."""
    done = attnbench(["run", "--suite", "quick", "--backends", "my-attention", "--only", ONLY, "--device", "cpu",
                      "--out", tmp_path / "results", "--run-id", "r", "--quiet"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return rows(tmp_path / "results" / "r")


@pytest.mark.slow
def test_the_readme_plugin_loaded_through_the_variable_runs_ok_and_agrees(tmp_path):
    (tmp_path / "my_attention.py").write_text(readme_plugin())
    records = run_quick(tmp_path, user_env(tmp_path, "my_attention:MyAttention"))
    assert sorted(r["case_id"] for r in records) == [ONLY, f"{ONLY}-causal"]
    for row in records:
        assert (row["backend"], row["status"], row["reason"]) == ("my-attention", "ok", None), row
        assert row["agree"] is True and row["max_abs_err"] is not None and row["samples"] >= 1, row


@pytest.mark.e2e
def test_the_readme_plugin_found_by_an_entry_point_and_the_variable_twice_is_one_backend(tmp_path):
    (tmp_path / "my_attention.py").write_text(readme_plugin())
    dist = tmp_path / "my_attention-0.1.dist-info"  # an installed distribution, as `pip install` leaves one
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-attention\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmy-attention = my_attention:MyAttention\n")
    env = user_env(tmp_path, "my_attention:MyAttention,my_attention:MyAttention")
    listed = attnbench(["backends", "--json"], env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    builtin = {b.name for b in load_registry(plugins=False).describe()}
    extra = [row for row in json.loads(listed.stdout) if row["name"] not in builtin]
    assert [(row["name"], row["available"]) for row in extra] == [("my-attention", True)], extra
    records = run_quick(tmp_path, env)
    assert sorted((r["case_id"], r["backend"], r["status"]) for r in records) == [
        (ONLY, "my-attention", "ok"), (f"{ONLY}-causal", "my-attention", "ok")]


def test_another_class_claiming_a_taken_name_is_listed_unavailable_naming_both_routes(tmp_path, monkeypatch):
    source = readme_plugin()
    (tmp_path / "contract_first.py").write_text(source)
    (tmp_path / "contract_second.py").write_text(source.replace("class MyAttention", "class OtherAttention"))
    (tmp_path / "contract_builtin.py").write_text(source.replace('name = "my-attention"', 'name = "sdpa"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "contract_first:MyAttention,contract_second:OtherAttention,contract_builtin:MyAttention")
    registry = load_registry()
    listing = {row.name: row for row in registry.describe()}
    assert type(registry.get("my-attention")).__module__ == "contract_first"
    assert type(registry.get("sdpa")).__module__ == "harness.backends.pytorch.sdpa"
    second = listing["contract_second:OtherAttention"]
    assert not second.available and "\n" not in second.reason
    for words in ("'my-attention'", "ATTNBENCH_BACKENDS entry contract_first:MyAttention", "contract_first.MyAttention",
                  "ATTNBENCH_BACKENDS entry contract_second:OtherAttention", "contract_second.OtherAttention"):
        assert words in second.reason, (words, second.reason)
    builtin = listing["contract_builtin:MyAttention"]
    assert not builtin.available and "'sdpa' is taken by the built-in backend" in builtin.reason, builtin.reason


def test_a_hook_named_twice_is_called_once_and_adds_its_backends_once(tmp_path, monkeypatch):
    (tmp_path / "contract_hook.py").write_text(readme_plugin() + "\n\nCALLS = []\n\n\ndef add(registry):\n"
                                               "    CALLS.append(1)\n    registry.add(MyAttention())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "contract_hook:add,contract_hook:MyAttention,contract_hook:add")
    registry = load_registry()
    import contract_hook

    assert len(contract_hook.CALLS) == 1
    assert [row.name for row in registry.describe() if row.family in ("example", "plugin")] == ["my-attention"]


@pytest.mark.parametrize("returned, words", [
    ("42", ["bad-prepare: prepare() returned a value of type int (42)", "a harness.backends.Prepared"]),
    ("None", ["bad-prepare: prepare() returned a value of type NoneType (None)"]),
    ("Prepared(fn='not a function')", ["bad-prepare: prepare() returned a Prepared whose fn is a value of type str"]),
    ("lambda q: q", ["bad-prepare: prepare() returned a callable that needs arguments (q)", "the timed call takes none"]),
], ids=["int", "None", "Prepared-of-str", "needs-an-argument"])
def test_a_prepare_that_returns_no_zero_argument_callable_is_an_error_row_saying_so(one_thread, returned, words):
    class BadPrepare(Backend):
        name, family = "bad-prepare", "example"

        def prepare(self, case, inputs):
            return eval(returned, {"Prepared": Prepared})

    record = execute(Case(B=1, S_q=16, S_kv=16, H=2, H_kv=2, d_k=8, d_v=8), BadPrepare())
    assert record.status is Status.ERROR and "\n" not in record.reason, record.reason
    for word in words:
        assert word in record.reason, (word, record.reason)


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_a_plain_callable_is_differentiated_with_respect_to_the_inputs_in_backward_modes(one_thread, mode):
    case = Case(B=1, S_q=32, S_kv=32, H=4, H_kv=2, d_k=16, d_v=16, causal=True, mode=mode)
    record = execute(case, plugin_class(readme_plugin())())
    assert (record.status, record.agree) == (Status.OK, True), record.reason


def registered_pytest_options() -> list[str]:
    """Every option harness.run.pytest_plugin registers, read by calling its `pytest_addoption` on a recorder."""
    from harness.run import pytest_plugin

    class Recorder:
        def __init__(self) -> None:
            self.names: list[str] = []

        def getgroup(self, *args, **kwargs) -> "Recorder":
            """Itself: an option of a group is an option."""
            return self

        def addoption(self, *names, **kwargs) -> None:
            """Keep the option's names."""
            self.names.extend(names)

    recorder = Recorder()
    pytest_plugin.pytest_addoption(recorder)
    return recorder.names


def test_every_option_of_the_pytest_route_is_documented_beside_its_example():
    options = registered_pytest_options()
    assert {"--attnbench-suite", "--attnbench-backends", "--attnbench-device", "--attnbench-timer"} <= set(options)
    text = section("## Long sweeps: failures, resume, several workers", USAGE)
    assert "pytest suites/test_bench.py" in text, "the options stand beside the route's example"
    missing = [name for name in options if not re.search(rf"`{re.escape(name)}[ `=]", text)]
    assert missing == [], f"docs/usage.md's pytest paragraph does not name {missing}"
