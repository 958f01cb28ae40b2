"""The real xFormers for the tests, imported the one way every xFormers test imports it."""

from __future__ import annotations

import sys

import pytest


def real_fmha():
    """The real `xformers.ops.fmha` (skips without xFormers), imported with any `flash_attn` hidden.

    xFormers' flash.py imports flash_attn.flash_attn_interface whenever a `flash_attn` package exists:
    flash-attn-4 alone (a namespace without it) makes `import xformers.ops` fail. Hidden, the import is
    the same beside any flash_attn (none bound as FlashAttention 2). Other xFormers tests import through it.
    """
    pytest.importorskip("xformers")
    from harness.backends.xformers.adapter import import_xformers

    with pytest.MonkeyPatch.context() as m:
        if "xformers.ops" not in sys.modules:
            m.setitem(sys.modules, "flash_attn", None)
        import_xformers()
    from xformers.ops import fmha

    return fmha
