"""Root conftest: being here, it puts the checkout on sys.path, so `harness` imports without an install under a bare `pytest`.

It loads no plugin on purpose: the attnbench plugin (suites as tests) is suites/conftest.py's, and
would otherwise run in every unit-test session (it freezes the garbage collector's survivors).
"""
