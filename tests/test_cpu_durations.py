"""tests/cpu_durations.py, as `make test` loads it: each test charged its own CPU and its children's, with and without xdist."""

import re
import subprocess
import sys

import pytest

from tests.checkout import ROOT

#: Three tests: CPU in a child process, CPU in the test's own process, none; CPU seconds, which load does not change.
BURNS = '''
import subprocess, sys

def test_child_burns():
    subprocess.run([sys.executable, "-c", "s = 0\\nfor i in range(4_000_000): s += i"], check=True)

def test_self_burns():
    s = 0
    for i in range(2_000_000): s += i

def test_idle():
    pass
'''
LINE = re.compile(r"^ *(\d+\.\d)s = +(\d+\.\d) \+ +(\d+\.\d)  test_burns\.py::(\w+)$", re.M)


# Under xdist the figures travel from the workers to the controller on the reports (two workers start: seconds).
@pytest.mark.parametrize("workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.slow)], ids=["in-process", "xdist"])
def test_each_test_is_charged_its_own_cpu_and_its_childrens(tmp_path, outside_xdist, workers):
    (tmp_path / "test_burns.py").write_text(BURNS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_durations",
                           "--cpu-durations=0", "--rootdir", str(tmp_path), str(tmp_path / "test_burns.py"), *workers],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {name: (float(total), float(own), float(children)) for total, own, children, name in LINE.findall(done.stdout)}
    assert set(rows) == {"test_child_burns", "test_self_burns", "test_idle"}, done.stdout
    assert [name for name, _ in sorted(rows.items(), key=lambda kv: -kv[1][0])][0] == "test_child_burns", done.stdout
    assert rows["test_child_burns"][2] > rows["test_child_burns"][1] and rows["test_self_burns"][1] > rows["test_self_burns"][2]
    assert rows["test_self_burns"][0] > rows["test_idle"][0], done.stdout
    assert re.search(r"^\d+\.\d CPU-s in 3 tests", done.stdout, re.M), done.stdout


def test_without_the_option_nothing_is_printed(tmp_path, outside_xdist):
    (tmp_path / "test_burns.py").write_text("def test_idle():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_durations",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_burns.py")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "CPU seconds" not in done.stdout and "CPU-s" not in done.stdout, done.stdout
