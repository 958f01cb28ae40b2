#!/bin/sh
# Create the project's virtual environment and install attnbench into it.
# A torch that the base Python already has (a CUDA build on a GPU box) is used as it is: the venv
# sees it through --system-site-packages and pip leaves it alone. Without one, the CPU build is
# installed by its exact version (TORCH_SPEC), because a plain `torch` requirement pulls a
# multi-gigabyte CUDA build.
# When everything attnbench needs is already importable (a GPU box without network, say), nothing is
# downloaded: `make bench` and `make test` run attnbench from the checkout (`python -m harness`).
set -eu
PYTHON=${1:-python3}
VENV=${2:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV"
else
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
        echo "setup: installing $TORCH_SPEC (CPU build where one is offered)"
        "$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
    fi
    # xFormers imports on a CPU (no CPU kernels): enough to list it honestly and to test its
    # adapter's argument translation with its own mask objects. --no-deps because its wheel pins
    # a CUDA torch; on a GPU box install the xFormers built for your torch yourself.
    "$VENV/bin/python" -c "import xformers" >/dev/null 2>&1 \
        || "$VENV/bin/python" -m pip install --quiet --no-deps "xformers==0.0.35" || echo "setup: xformers not installed (its tests will skip)"
fi
# Ray (the `ray` extra, for `attnbench run --executor ray`) is optional: `make bench` runs without it.
# `make test` asks for it (ATTNBENCH_WITH_RAY=1) so tests/test_ray_executor.py runs; CI must have it.
WITH_RAY=${ATTNBENCH_WITH_RAY:-0}
case "${CI:-}" in "" | 0 | false) ;; *) WITH_RAY=1 ;; esac
NEEDED="torch, numpy, pandas, matplotlib, pytest, pytest_benchmark, pytest_timeout"
if "$VENV/bin/python" -c "import $NEEDED" >/dev/null 2>&1; then
    echo "setup: torch, numpy, pandas, matplotlib, pytest, pytest-benchmark and pytest-timeout are installed: nothing to download"
else
    "$VENV/bin/python" -m pip install --quiet -e ".[test]"
fi
if [ "$WITH_RAY" = 1 ] && ! "$VENV/bin/python" -c "import ray" >/dev/null 2>&1; then
    if ! "$VENV/bin/python" -m pip install --quiet "ray>=2.8"; then
        case "${CI:-}" in "" | 0 | false) echo "setup: ray not installed (tests/test_ray_executor.py will skip)" ;; *) exit 1 ;; esac
    fi
fi
"$VENV/bin/python" -c "import torch, harness; print('setup: attnbench', harness.__version__, 'with torch', torch.__version__)"
"$VENV/bin/python" -c "import ray; print('setup: ray', ray.__version__, '(for --executor ray)')" 2>/dev/null || true
