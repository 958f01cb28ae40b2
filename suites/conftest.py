"""The suites' tests need the attnbench plugin (pairs as tests, timed through pytest-benchmark); unit-test sessions never load it."""

pytest_plugins = ("harness.run.pytest_plugin",)
