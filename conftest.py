"""Root conftest: the attnbench pytest plugin serves both suites/ and tests/."""

pytest_plugins = ("harness.run.pytest_plugin",)
