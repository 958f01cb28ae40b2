"""harness/policy/reader.py is one standard-library file a framework copies: it runs alone in an isolated Python and answers as attnbench does."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.policy import reader
from harness.policy.build import build_policy
from harness.policy.sources import load_folders
from tests.policy_runs import grid_run

READER = Path(reader.__file__)

QUESTIONS = [
    dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=32, S_q=128, S_kv=128),
    dict(dtype="torch.float32", mode="fwd", causal=False, H=8, H_kv=8, d_k=32, S_q=600, S_kv=600),
    dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=64, S_q=128, S_kv=128),  # a head dim never measured
    dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=32, S_q=256, S_kv=256),  # a step never measured
    dict(dtype="bf16", mode="fwd", causal=True, H=8, H_kv=2, d_k=32, S_q=128, S_kv=128),  # a dtype never measured
]


def test_the_reader_imports_the_standard_library_alone():
    """Every import of the file is a standard-library module: nothing of attnbench, nothing third-party."""
    names = set()
    for node in ast.walk(ast.parse(READER.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names


def test_the_reader_runs_alone_in_an_isolated_python_and_answers_as_attnbench_does(tmp_path):
    """The file copied under another name into an empty folder, run by `python -I -S` (no site-packages, no PYTHONPATH, no
    attnbench): its answers are the in-process reader's, None where the policy has no evidence."""
    policy_file = tmp_path / "policy.json"
    policy = build_policy(load_folders([grid_run(tmp_path / "run-a")]))
    policy_file.write_text(json.dumps(policy))
    alone = tmp_path / "framework"
    alone.mkdir()
    shutil.copy(READER, alone / "attn_policy_reader.py")
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(alone)!r})\n"
        "from attn_policy_reader import choose\n"
        f"questions = json.loads({json.dumps(json.dumps(QUESTIONS))})\n"
        f"answers = [choose({str(policy_file)!r}, **q) for q in questions]\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('harness', 'numpy', 'pandas', 'torch'))\n"
        "print(json.dumps({'answers': answers, 'leaked': leaked, 'site': 'site' in sys.modules, 'path': sys.path}))\n"
    )
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, cwd=alone, timeout=60)
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    assert got["leaked"] == [] and got["site"] is False and not any("site-packages" in p for p in got["path"]), got
    expected = [reader.choose(policy, **q) for q in QUESTIONS]
    assert got["answers"] == expected == ["sdpa", "sdpa", None, None, None]


def test_the_reader_refuses_what_it_cannot_read(tmp_path):
    """Another schema version, several devices without device=, an unknown variant: a ValueError or TypeError, never a guess."""
    policy = {"schema_version": 1, "devices": {"a": {"buckets": {}}, "b": {"buckets": {}}}}
    with pytest.raises(ValueError, match="holds 2 devices"):
        reader.choose(policy, **QUESTIONS[0])
    assert reader.choose(policy, device="a", **QUESTIONS[0]) is None
    with pytest.raises(ValueError, match="schema_version 2"):
        reader.choose(dict(policy, schema_version=2), device="a", **QUESTIONS[0])
    with pytest.raises(TypeError, match="unknown variant 'sliding'"):
        reader.choose(policy, device="a", sliding=128, **QUESTIONS[0])


def test_buckets_are_log2_steps_of_the_lengths():
    """2^k holds 2^k to 2^(k+1) - 1: 128 and 255 share a bucket, 256 starts the next; a ragged decode batch is its own kind."""
    key = reader.bucket_key
    base = dict(dtype="fp32", mode="fwd", causal=True, H=8, H_kv=2, d_k=32)
    assert key(**base, S_q=128, S_kv=128) == key(**base, S_q=255, S_kv=200) != key(**base, S_q=256, S_kv=256)
    assert key(**base, S_q=1, S_kv=4096, layout="paged").endswith("paged:decode Sq~2^0 Skv~2^12")
    assert key(**base, S_q=1, S_kv=4096) != key(**base, S_q=1, S_kv=4096, layout="paged")
    assert "window~2^7+sinks" in key(**base, S_q=1, S_kv=4096, window=128, sinks=True)
