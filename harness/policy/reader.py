"""Read an attnbench backend policy: which attention backend a measured policy chooses for one shape.

This one file is the whole reader. It uses the Python standard library alone, so a serving or training framework may
copy it into its own tree (no attnbench, no third-party package needed):

    import json
    from attn_policy_reader import choose      # this file, copied under any name

    policy = json.load(open("policy.json"))    # written by `attnbench policy RUN ... --out policy.json`
    backend = choose(policy, dtype="bf16", mode="fwd", causal=True, H=32, H_kv=8, d_k=128, S_q=4096, S_kv=4096)
    if backend is None:
        ...  # no evidence for this shape: keep the framework's own default, and measure it

A shape falls in one bucket (`bucket_key`): dtype, mode, causal, score variants, head dim, the query/KV head ratio,
the batch's layout (and, for a ragged serving batch, its kind: decode, prefill or mixed), and the log2 bucket of
S_q and S_kv (floor(log2 S): 2^7 holds 128 to 255). `choose` returns the bucket's measured choice, or None where the
policy has no evidence for the bucket: it never guesses. The policy's JSON schema: docs/policy.md (schema_version 1).
"""

from __future__ import annotations

import json
import os

#: The schema this reader understands; a policy of another version is refused rather than misread.
SCHEMA_VERSION = 1
#: The score variants (and other case fields) that make a different problem, each a keyword `choose` takes.
VARIANTS = ("window", "softcap", "sinks", "alibi", "scale", "mla", "deterministic", "kv_dtype", "d_v")
#: Batch layouts: a dense rectangle, or a ragged serving batch (harness.suite.case_layout).
LAYOUTS = ("dense", "padded", "packed", "paged")
#: A ragged batch's kind: every request decodes one token, every request prefills, or both in one batch.
BATCH_KINDS = ("decode", "prefill", "mixed")
#: Other names of a dtype (torch's, numpy's) and the policy's own.
_DTYPES = {"float32": "fp32", "float": "fp32", "fp32": "fp32", "float16": "fp16", "half": "fp16", "fp16": "fp16",
           "bfloat16": "bf16", "bf16": "bf16", "float64": "fp64", "double": "fp64", "fp64": "fp64",
           "float8_e4m3fn": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "e4m3": "fp8_e4m3",
           "float8_e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2"}
#: Modes by their other names.
_MODES = {"fwd": "fwd", "forward": "fwd", "bwd": "bwd", "backward": "bwd", "fwd_bwd": "fwd_bwd", "fwd+bwd": "fwd_bwd", "train": "fwd_bwd"}


def canonical_dtype(dtype: object) -> str:
    """'fp32', 'bf16', ... for a policy's name, torch's ('torch.bfloat16') or numpy's; ValueError for an unknown one."""
    name = str(dtype).lower().replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(sorted(set(_DTYPES.values())))}")
    return _DTYPES[name]


def log2_bucket(n: int) -> int:
    """floor(log2 n) for a positive whole number: the bucket 2^k holds 2^k to 2^(k+1) - 1."""
    n = int(n)
    if n < 1:
        raise ValueError(f"a length must be a positive whole number, got {n}")
    return n.bit_length() - 1


def _on(value: object) -> bool:
    """Whether a variant's value turns it on (None, False, 0 and NaN do not)."""
    return value is not None and value is not False and value == value and value != 0


def variant_of(variants: dict, d_k: int) -> str:
    """The score variants as a bucket names them ('plain', 'window~2^7+sinks', 'softcap', 'kv_fp8_e4m3' ...)."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise TypeError(f"unknown variant {unknown[0]!r}: a bucket knows {', '.join(VARIANTS)}")
    parts = []
    for name in VARIANTS:
        value = variants.get(name)
        if not _on(value):
            continue
        if name == "window":
            parts.append(f"window~2^{log2_bucket(value)}")
        elif name == "kv_dtype":
            parts.append(f"kv_{canonical_dtype(value)}")
        elif name == "d_v":
            if int(value) != int(d_k):  # d_v = d_k is the plain case: no part of its own
                parts.append(f"dv{int(value)}")
        else:  # softcap and scale change the scores, not the work: their presence decides, not their value
            parts.append(name)
    return "+".join(parts) or "plain"


def batch_of(layout: str, S_q: int, kind: str | None = None) -> str:
    """'dense', or a ragged batch's layout and kind ('paged:decode'); a ragged batch's kind defaults to decode when S_q is 1, else prefill."""
    layout = layout or "dense"
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if layout == "dense":
        return "dense"
    kind = kind or ("decode" if int(S_q) == 1 else "prefill")
    if kind not in BATCH_KINDS:
        raise ValueError(f"unknown batch kind {kind!r}: expected one of {', '.join(BATCH_KINDS)}")
    return f"{layout}:{kind}"


def bucket_fields(*, dtype: object, mode: str, causal: bool, H: int, H_kv: int, d_k: int, S_q: int, S_kv: int,
                  layout: str = "dense", kind: str | None = None, **variants: object) -> dict:
    """The fields that name a shape's bucket, as a policy entry's `bucket` holds them."""
    if int(H_kv) < 1 or int(H) % int(H_kv):
        raise ValueError(f"H={H} is not a multiple of H_kv={H_kv}")
    if str(mode).lower() not in _MODES:
        raise ValueError(f"unknown mode {mode!r}: expected fwd, bwd or fwd_bwd")
    return {"dtype": canonical_dtype(dtype), "mode": _MODES[str(mode).lower()], "causal": bool(causal), "variant": variant_of(variants, d_k),
            "d_k": int(d_k), "group": int(H) // int(H_kv), "batch": batch_of(layout, S_q, kind),
            "S_q_log2": log2_bucket(S_q), "S_kv_log2": log2_bucket(S_kv)}


def key_of(fields: dict) -> str:
    """A bucket's key in a policy: 'bf16 fwd causal plain dk128 H/Hkv=4 dense Sq~2^12 Skv~2^12'."""
    return (f"{fields['dtype']} {fields['mode']} {'causal' if fields['causal'] else 'full'} {fields['variant']} dk{fields['d_k']} "
            f"H/Hkv={fields['group']} {fields['batch']} Sq~2^{fields['S_q_log2']} Skv~2^{fields['S_kv_log2']}")


def bucket_key(**shape: object) -> str:
    """The key of the bucket a shape falls in (the keywords of `choose` but the policy and the device)."""
    return key_of(bucket_fields(**shape))


def load(policy: object) -> dict:
    """A policy as a dict: the dict itself, or the JSON file a path names; ValueError for another schema version."""
    if isinstance(policy, (str, os.PathLike)):
        with open(policy, encoding="utf-8") as f:
            policy = json.load(f)
    if not isinstance(policy, dict) or not isinstance(policy.get("devices"), dict):
        raise ValueError("not an attnbench policy: it has no 'devices' object")
    if policy.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"policy schema_version {policy.get('schema_version')!r}: this reader reads version {SCHEMA_VERSION}")
    return policy


def device_of(policy: dict, device: str | None) -> str | None:
    """The device a question is for: `device`, or the policy's only one when None (ValueError when it holds several)."""
    devices = sorted(policy["devices"])
    if device is not None:
        return device if device in policy["devices"] else None
    if len(devices) != 1:
        raise ValueError(f"the policy holds {len(devices)} devices ({', '.join(devices) or 'none'}): name one with device=")
    return devices[0]


def entry(policy: object, *, device: str | None = None, **shape: object) -> dict | None:
    """The policy's whole entry for a shape (choice, ranking, margin, evidence), or None where it has no evidence."""
    policy = load(policy)
    name = device_of(policy, device)
    if name is None:
        return None
    found = policy["devices"][name].get("buckets", {}).get(bucket_key(**shape))
    return found if found and found.get("choice") else None


def choose(policy: object, *, device: str | None = None, dtype: object, mode: str, causal: bool, H: int, H_kv: int, d_k: int,
           S_q: int, S_kv: int, **variants: object) -> str | None:
    """The backend the policy chose for this shape on `device` (None: the policy's only device), or None without evidence."""
    found = entry(policy, device=device, dtype=dtype, mode=mode, causal=causal, H=H, H_kv=H_kv, d_k=d_k, S_q=S_q, S_kv=S_kv, **variants)
    return None if found is None else str(found["choice"])
