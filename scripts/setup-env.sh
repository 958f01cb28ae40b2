#!/bin/sh
# Create the project's virtual environment: sh scripts/setup-env.sh [PYTHON] [VENV] [bench|test]
#
# A PYTHON that already imports torch (a GPU box, where `python3` is often itself a virtual
# environment holding the CUDA torch) is used as it is: VENV is built to see PYTHON's own packages
# (a .pth file that adds PYTHON's site-packages, with their .pth files, the way PYTHON sees them;
# `--system-site-packages` would show only the *base* interpreter's), torch is never installed
# over it, and only what is missing is installed, by name, with torch held to its version. When
# nothing is missing nothing is downloaded, and attnbench runs from the checkout (`python -m
# harness`), so nothing needs building either. Without a torch anywhere (a CPU machine, CI), the
# CPU build is installed by its exact version (TORCH_SPEC: a plain `torch` requirement pulls a
# multi-gigabyte CUDA build), then attnbench itself with its test extra.
#
# ATTNBENCH_PIP: a command run instead of "$VENV/bin/python -m pip" (tests record with it what
# would be installed, without installing anything).
set -eu
PYTHON=${1:-python3}
VENV=${2:-.venv}
PURPOSE=${3:-bench}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# module:requirement, as pyproject.toml's dependencies (tests/test_setup_offline.py holds them equal).
# tomllib:tomli: on Python 3.10 only (tomllib is the standard library's from 3.11, so there it is never missing).
RUNTIME_NEEDS="numpy:numpy>=1.24 pandas:pandas>=2.0 matplotlib:matplotlib>=3.7 pytest:pytest>=7.4 pytest_benchmark:pytest-benchmark>=4.0 tomllib:tomli>=1.1"
# sqlalchemy, psycopg: the results database (pyproject's `db` extra), on SQLite and on PostgreSQL (`--db postgresql://…`),
# which the tests run against a real server; pytest-xdist: `make test` runs in parallel. Not for bench: the GPU box has neither, and no index to fetch them from.
TEST_NEEDS="pytest_timeout:pytest-timeout>=2.1 xdist:pytest-xdist>=3.5 sqlalchemy:sqlalchemy>=2.0 psycopg:psycopg[binary]>=3.1"

case "$PURPOSE" in
    bench) NEEDS=$RUNTIME_NEEDS ;;
    test) NEEDS="$RUNTIME_NEEDS $TEST_NEEDS" ;;
    *) echo "setup: unknown purpose '$PURPOSE': expected bench or test" >&2; exit 2 ;;
esac
# Ray (the `ray` extra, for `attnbench run --executor ray`) is optional: `make bench` runs without it.
# `make test` asks for it so tests/test_ray_executor.py runs; CI must have it.
WITH_RAY=0
[ "$PURPOSE" = test ] && WITH_RAY=1
case "${CI:-}" in "" | 0 | false) IN_CI=0 ;; *) IN_CI=1; WITH_RAY=1 ;; esac

pip_in_venv() {
    if [ -n "${ATTNBENCH_PIP:-}" ]; then
        $ATTNBENCH_PIP "$@"
    else
        # A VENV built --without-pip uses PYTHON's pip; where PYTHON has none, the bundled one (offline).
        "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip >/dev/null
        "$VENV/bin/python" -m pip "$@"
    fi
}

# The requirements of NEEDS whose module does not import in VENV, space-separated.
missing_requirements() {
    "$VENV/bin/python" - $NEEDS <<'EOF'
import importlib, sys
missing = []
for pair in sys.argv[1:]:
    module, requirement = pair.split(":", 1)
    try:
        importlib.import_module(module)
    except Exception:  # not installed, or installed but broken: either way it must be installed
        missing.append(requirement)
print(" ".join(missing))
EOF
}

# "VERSION FILE" of the torch PYTHON ($1) would import, or a failure where it has none. Read from its installed metadata where
# that names the same file: an import costs seconds, and a `make test` set-up asked twice. A torch no metadata
# describes (a source checkout, a folder on the path) is imported.
torch_of() {
    "$1" - 2>/dev/null <<'EOF'
import importlib.metadata, importlib.util, os, sys
spec = importlib.util.find_spec("torch")
if spec is None or spec.origin is None:
    sys.exit(1)
try:
    dist = importlib.metadata.distribution("torch")
    described = os.path.realpath(dist.locate_file("torch/__init__.py")) == os.path.realpath(spec.origin)
except importlib.metadata.PackageNotFoundError:
    described = False
if described:
    print(dist.version, spec.origin)
else:
    import torch
    print(torch.__version__, torch.__file__)
EOF
}

# VENV sees PYTHON's packages: a .pth in VENV's site-packages adds each of PYTHON's site directories.
see_packages_of_python() {
    if [ ! -x "$VENV/bin/python" ]; then
        # No pip of its own: PYTHON's pip (seen through the .pth) installs into VENV when needed.
        "$PYTHON" -m venv --without-pip "$VENV"
    fi
    purelib=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PYTHON" - "$purelib/_attnbench_python_packages.pth" "$PYTHON" <<'EOF'
import os, site, sys
dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
dirs = [d for d in dirs if os.path.isdir(d) and os.path.realpath(d) != os.path.realpath(os.path.dirname(sys.argv[1]))]
with open(sys.argv[1], "w") as f:
    f.write(f"# Written by scripts/setup-env.sh: this environment sees the packages of {sys.argv[2]} ({sys.executable}).\n")
    # One statement list per line (site exec()s it; a comprehension there would not see `site`). A dir
    # the environment already has is skipped, so its .pth files are not run twice.
    for d in dirs:
        f.write(f"import sys, site; {d!r} in sys.path or site.addsitedir({d!r})\n")
EOF
}

# The GPU libraries' own code, which the tests hold the adapters to (tests/test_*_library.py), on a CPU machine:
# flashinfer-python and flash-attn-4 ship Python and install (--no-deps: their CUDA dependencies have no use
# here, and neither imports without them: the tests read their source with ast); flash-attn 2 has no wheel,
# so its sdist (FA2's flash_api.cpp and interface, FA3's setup) is downloaded, never built, into
# $VENV/share/attnbench. Only for `test`, and only into an environment whose torch this script installed.
LIBRARY_PINS="flashinfer-python==0.7.2.post1 flash-attn-4==4.0.0b36"
# flashinfer-bench's trace schema (pydantic models), which `attnbench export --format flashinfer-bench` is validated against;
# --no-deps (its TVM FFI has no use here) with the three packages its data models import.
TRACE_SCHEMA_PINS="flashinfer-bench==0.1.2"
TRACE_SCHEMA_NEEDS="pydantic>=2 safetensors docstring-parser"
FLASH_ATTN2_SDIST="flash-attn==2.8.3"
install_library_sources() {
    sources="$VENV/share/attnbench"
    mkdir -p "$sources"
    if ! "$VENV/bin/python" -c "import importlib.util as u; import sys; sys.exit(not (u.find_spec('flashinfer') and u.find_spec('flash_attn.cute')))" 2>/dev/null; then
        # shellcheck disable=SC2086 # one word per requirement
        pip_in_venv install --quiet --no-deps $LIBRARY_PINS || library_sources_missing "$LIBRARY_PINS"
    fi
    if ! "$VENV/bin/python" -c "import flashinfer_bench.data" 2>/dev/null; then
        # shellcheck disable=SC2086 # one word per requirement
        { pip_in_venv install --quiet $TRACE_SCHEMA_NEEDS && pip_in_venv install --quiet --no-deps $TRACE_SCHEMA_PINS; } \
            || library_sources_missing "$TRACE_SCHEMA_PINS"
    fi
    if [ -z "$(ls "$sources"/flash_attn-2.8.3.tar.gz 2>/dev/null)" ]; then
        # pip reads the sdist's metadata by running its setup.py, which imports torch, setuptools, wheel and
        # packaging: no build isolation (it would lack torch), and no CUDA build (nothing is compiled).
        pip_in_venv install --quiet setuptools wheel packaging || true
        FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip_in_venv download --quiet --no-deps --no-build-isolation \
            --no-binary :all: "$FLASH_ATTN2_SDIST" -d "$sources" || library_sources_missing "$FLASH_ATTN2_SDIST (sdist)"
    fi
}
library_sources_missing() {
    [ "$IN_CI" = 1 ] && { echo "setup: could not get $1, which CI's library tests read" >&2; exit 1; }
    echo "setup: $1 not installed (the tests that read its source will skip)"
}

python_torch=$(torch_of "$PYTHON") || python_torch=
if [ -n "$python_torch" ]; then
    torch_version=${python_torch%% *}
    echo "setup: $PYTHON holds torch $python_torch; it is used as it is, never replaced"
    see_packages_of_python
    # A VENV left by an earlier set-up may hold a torch of its own (installed over the network),
    # which would shadow PYTHON's: refused, never used. Where VENV would import torch from is enough to know
    # it is PYTHON's; only a VENV refused pays for importing its torch, to say which one it sees.
    venv_torch_file=$("$VENV/bin/python" -c 'import importlib.util as u; s = u.find_spec("torch"); print(s.origin if s else "")')
    if [ "$venv_torch_file" = "${python_torch#* }" ]; then
        venv_torch=$python_torch
    else
        venv_torch=$(torch_of "$VENV/bin/python") || venv_torch=""
        echo "setup: $VENV sees torch '${venv_torch:-none}', not $PYTHON's: remove $VENV (make clean) and run again" >&2
        exit 1
    fi
    # Held by a constraint, torch can only stay as it is, whatever a missing package asks for.
    constraints="$VENV/attnbench-torch-constraint.txt"
    echo "torch==$torch_version" >"$constraints"
    pip_constraint="-c $constraints"
    missing=$(missing_requirements)
    if [ -z "$missing" ]; then
        echo "setup: nothing to install: torch and every package $PURPOSE needs import from $PYTHON's packages"
    else
        echo "setup: installing only what is missing: $missing (torch held at $torch_version)"
        # shellcheck disable=SC2086 # one word per requirement
        if ! pip_in_venv install --quiet $pip_constraint $missing; then
            echo "setup: could not install $missing (is a package index reachable?): install them into $PYTHON and run again" >&2
            exit 1
        fi
    fi
else
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    venv_torch=$(torch_of "$VENV/bin/python") || venv_torch=""
    if [ -z "$venv_torch" ]; then
        echo "setup: installing $TORCH_SPEC (CPU build where one is offered)"
        pip_in_venv install --quiet "$TORCH_SPEC"
    fi
    # xFormers imports on a CPU (no CPU kernels): enough to list it honestly and to test its
    # adapter's argument translation with its own mask objects. --no-deps because its wheel pins
    # a CUDA torch; on a GPU box install the xFormers built for your torch yourself.
    "$VENV/bin/python" -c "import xformers" >/dev/null 2>&1 \
        || pip_in_venv install --quiet --no-deps "xformers==0.0.35" || echo "setup: xformers not installed (its tests will skip)"
    if [ "$PURPOSE" = test ]; then
        install_library_sources
    fi
    # Every package NEEDS names, not a list of its own: one added to NEEDS (sqlalchemy, psycopg for test) reaches an existing VENV too.
    if [ -z "$(missing_requirements)" ]; then
        echo "setup: torch and every package $PURPOSE needs are installed: nothing to download"
    else
        pip_in_venv install --quiet -e ".[test]"
    fi
    pip_constraint=""
fi
# Each `import torch` or `import ray` costs seconds (more on a busy machine): each is asked once a set-up where it can be.
ray_of() {
    "$VENV/bin/python" -c 'import ray; print(ray.__version__)' 2>/dev/null
}
ray_version=$(ray_of) || ray_version=""
if [ "$WITH_RAY" = 1 ] && [ -z "$ray_version" ]; then
    # shellcheck disable=SC2086 # empty, or -c and its file
    if pip_in_venv install --quiet $pip_constraint "ray>=2.8"; then
        ray_version=$(ray_of) || ray_version=""
    else
        [ "$IN_CI" = 1 ] && exit 1
        echo "setup: ray not installed (tests/test_ray_executor.py will skip)"
    fi
fi
# The torch VENV saw before any install is still its torch where nothing was installed over it (the box's, held; or one
# already there); after an install, the import below is the check that the install took.
[ -n "${venv_torch:-}" ] || venv_torch=$(torch_of "$VENV/bin/python") || { echo "setup: torch does not import in $VENV" >&2; exit 1; }
harness_version=$("$VENV/bin/python" -c 'import harness; print(harness.__version__)') || exit 1
echo "setup: attnbench $harness_version with torch ${venv_torch%% *} from ${venv_torch#* }"
[ -z "$ray_version" ] || echo "setup: ray $ray_version (for --executor ray)"
