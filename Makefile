# attnbench: `make bench` and `make test` each set themselves up (see README.md).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.attnbench-installed
TEST_STAMP := $(VENV)/.attnbench-test-installed
# `make bench SUITE=quick` (or a .toml file); ARGS holds the rest, e.g. ARGS="--backends naive,sdpa".
SUITE ?= auto
ARGS ?=

.PHONY: bench test test-fast gpu-check setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup-env.sh
	sh scripts/setup-env.sh "$(PYTHON)" "$(VENV)" bench
	touch $(STAMP)

## bench: run `quick` on CPU or `default` on CUDA (SUITE=...), write results/<run-id>/ and reports/<run-id>/, print the report's path last
# `-m harness` from the checkout's root: attnbench runs from here whether or not it is pip-installed.
bench: $(STAMP)
	$(VPY) -m harness run --suite $(SUITE) --report $(ARGS)

# The tests also need pytest-timeout and exercise `--executor ray` on a local Ray cluster: make test installs them (make bench does not).
$(TEST_STAMP): $(STAMP)
	sh scripts/setup-env.sh "$(PYTHON)" "$(VENV)" test
	touch $(TEST_STAMP)

# Tests run in parallel (pytest-xdist): more workers than cores, since many wait on worker processes of their own, and
# beside other work each runnable worker is one more share of the CPU: on the 2-core machine, beside two CPU-bound
# processes, 6 workers took 450-478 s where 4 took 619-653 s; quiet, 406 s against 368 s one day, 339 s against 347 s another.
# `--dist loadgroup` keeps each shared service's tests (a Ray head, a PostgreSQL server) on one worker.
TEST_WORKERS ?= 6
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup
# Bytecode is cached for the tests' hundreds of processes (each worker, each `attnbench` child): where the shell sets
# PYTHONDONTWRITEBYTECODE, every one would compile harness/ and rewrite the tests' asserts again (8 s per collection).
# One torch thread per process: xdist's workers and their children share 2 cores, where more intra-op threads only spin
# against each other (a 10 us call took 83 ms so). Tests of thread counts give theirs explicitly.
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE OMP_NUM_THREADS=1
# The inner loop leaves out every test marked for its cost (pyproject.toml lists the markers).
FAST_TIER := not e2e and not slow and not compile and not ray and not postgres and not browser

# The slowest tests by wall time and by CPU seconds: on a busy machine walls grow together, CPU seconds little (821 against 883).
SLOWEST := --durations=25 -p tests.cpu_durations --cpu-durations=25

## test: the whole CPU test suite (what CI runs), in parallel; the 25 slowest tests, by wall and by CPU, are printed
test: $(TEST_STAMP)
	$(TEST_ENV) $(VPY) -m pytest -q $(PYTEST_PARALLEL) $(SLOWEST) $(ARGS)

## test-fast: the inner-loop tier (no end-to-end runs, compiles, services or browser), in parallel
test-fast: $(TEST_STAMP)
	$(TEST_ENV) $(VPY) -m pytest -q $(PYTEST_PARALLEL) -m "$(FAST_TIER)" $(ARGS)

## gpu-check: a short all-backend check on a CUDA box, with the python3 already there (no install)
gpu-check:
	$(PYTHON) -m harness gpu-check $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
