from harness.backends.registry import load_registry


def test_registry_lists_builtins():
    names = load_registry().names()
    assert names[:2] == ["naive", "sdpa"]
