# attnbench: `make bench` and `make test` each set themselves up (see README.md).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.attnbench-installed
TEST_STAMP := $(VENV)/.attnbench-test-installed
# `make bench SUITE=quick` (or a .toml file); ARGS holds the rest, e.g. ARGS="--backends naive,sdpa".
SUITE ?= auto
ARGS ?=

.PHONY: bench test gpu-check setup clean

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

## test: the CPU test suite (what CI runs)
test: $(TEST_STAMP)
	$(VPY) -m pytest -q $(ARGS)

## gpu-check: a short all-backend check on a CUDA box, with the python3 already there (no install)
gpu-check:
	$(PYTHON) -m harness gpu-check $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
