#!/bin/sh
# Create the project's virtual environment and install attnbench into it.
# A torch that the base Python already has (a CUDA build on a GPU box) is used as it is: the venv
# sees it through --system-site-packages and pip leaves it alone. Without one, the CPU build is
# installed by its exact version (TORCH_SPEC), because a plain `torch` requirement pulls a
# multi-gigabyte CUDA build.
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
    "$VENV/bin/python" -m pip install --quiet --no-deps "xformers==0.0.35" || echo "setup: xformers not installed (its tests will skip)"
fi
# Ray (the `ray` extra, for `attnbench run --executor ray`) is optional: `make bench` runs without it.
# CI (CI=true) installs it so that tests/test_ray_executor.py runs there instead of skipping, and so does
# ATTNBENCH_WITH_RAY=1 anywhere. It is the minimal `ray` wheel (~80 MB, no dashboard).
EXTRAS=test
case "${CI:-}" in "" | 0 | false) ;; *) EXTRAS=test,ray ;; esac
if [ "${ATTNBENCH_WITH_RAY:-0}" = 1 ]; then EXTRAS=test,ray; fi
"$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
"$VENV/bin/python" -c "import torch, harness; print('setup: attnbench', harness.__version__, 'with torch', torch.__version__)"
case "$EXTRAS" in *ray*) "$VENV/bin/python" -c "import ray; print('setup: ray', ray.__version__, '(for --executor ray)')" ;; esac
