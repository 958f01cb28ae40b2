# attnbench: `make bench` and `make test` each set themselves up (see README.md).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.attnbench-installed
TEST_STAMP := $(VENV)/.attnbench-test-installed
ARGS ?=

.PHONY: bench test gpu-check setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup-env.sh
	sh scripts/setup-env.sh "$(PYTHON)" "$(VENV)"
	touch $(STAMP)

## bench: run `quick` on CPU or `default` on CUDA, write results/<run-id>/ and reports/<run-id>/, print the report's path last
bench: $(STAMP)
	$(VPY) -m harness run --suite auto --report $(ARGS)

# The tests also exercise `--executor ray` on a local Ray cluster: make test installs Ray (make bench does not).
$(TEST_STAMP): $(STAMP)
	ATTNBENCH_WITH_RAY=1 sh scripts/setup-env.sh "$(PYTHON)" "$(VENV)"
	touch $(TEST_STAMP)

## test: the CPU test suite (what CI runs)
test: $(TEST_STAMP)
	$(VPY) -m pytest -q $(ARGS)

## gpu-check: a short all-backend check on a CUDA box, with the python3 already there (no install)
gpu-check:
	$(PYTHON) -m harness gpu-check $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
