"""env.json and peaks.json of a Ray run: one entry per node, and top-level summaries only where the nodes agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.run import protocol
from harness.run.ray_tasks import no_peaks


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    protocol.atomic_write(path, json.dumps(data, indent=1, default=str))


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One fingerprint for several nodes: a field's value when all agree, else their values joined by ' | ' (time: the earliest)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for entry in entries for k in entry):
        values = [entry.get(key) for entry in entries]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) == 1:
            out[key] = values[0]
        elif key == "time_utc":
            out[key] = min(str(v) for v in values if v is not None)
        else:
            out[key] = " | ".join(sorted({str(v) for v in values}))
    return out


def env_with_nodes(env: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """env.json with `nodes` merged in, and its top-level fields (what reports and `compare` read) summarising every node."""
    env = dict(env)
    known = env.get("nodes")
    if not isinstance(known, dict):
        # A run begun by the local executor: the machine that ran its rows is one more node.
        known = {"local": {k: env[k] for k in ("before", "telemetry_before", "telemetry_after") if k in env}} if env.get("before") else {}
    known = {label: dict(entry) for label, entry in known.items()}
    for label, entry in nodes.items():
        known.setdefault(label, {}).update(entry)
    env["executor"] = "ray"
    env["nodes"] = known
    befores = [entry["before"] for entry in known.values() if isinstance(entry.get("before"), dict)]
    if befores:
        env["before"] = summarize(befores)
    for when in ("telemetry_before", "telemetry_after"):
        values = [entry.get(when) for entry in known.values() if when in entry]
        if len(known) == 1 and values:
            env[when] = values[0]
        elif any(v is not None for v in values):
            # A report lists GPUs by index: indices of different nodes would be mixed up, so they stay per node.
            env[when] = {"unavailable": f"{len(known)} nodes: each node's GPU telemetry is in env.json under nodes.<node>.{when}"}
        elif values:
            env[when] = None
    return env


def peaks_with_nodes(peaks: dict[str, Any], nodes: dict[str, dict[str, Any]], device: str,
                     legacy_device_name: str | None = None) -> dict[str, Any]:
    """peaks.json with `nodes` merged in; top-level ceilings (the ones the analysis applies) only when every node has the same device."""
    known = peaks.get("nodes")
    if not isinstance(known, dict):
        known = {}
        if peaks.get("matmul") is not None or peaks.get("errors"):  # peaks a local run measured on its own machine
            legacy = dict(peaks)
            legacy.setdefault("device_name", legacy_device_name)
            known["local"] = legacy
    known = {**known, **nodes}
    measured = {label: p for label, p in known.items() if isinstance(p, dict) and (p.get("matmul") or p.get("copy"))}
    names = sorted({str(p.get("device_name")) for p in measured.values()})
    if len(names) == 1:
        label = min(measured)
        top = {k: v for k, v in measured[label].items() if k != "nodes"}
        top["node"] = label
    else:
        why = ("no node's ceilings were measured" if not measured else
               f"the nodes have different devices ({'; '.join(names)}): "
               "each node's ceilings are under nodes, never applied to another device's rows")
        top = no_peaks(device, why)
    top["nodes"] = known
    return top


# -- the driver ---------------------------------------------------------------------------------------------------------
