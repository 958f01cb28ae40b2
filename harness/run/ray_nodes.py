"""The nodes of a Ray run: reaching the head at --ray-address in bounded time, and env.json and peaks.json with one entry
per node and top-level summaries only where the nodes agree."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.files import MAX_DOCUMENT_BYTES, parse_json, read_regular
from harness.run import protocol
from harness.run.ray_tasks import no_peaks


#: How long --ray-address may take to accept a connection and answer the HTTP/2 preface every gRPC server (Ray's GCS)
#: answers at once: a live head answers in milliseconds, a loaded one across a slow network in well under this.
#: CONNECT_TIMEOUT_ENV overrides it (seconds, a positive number), e.g. for a tunnel that is slow to open.
CONNECT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_ENV = "ATTNBENCH_RAY_CONNECT_TIMEOUT_S"
#: The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own SETTINGS frame (type 4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4


def check_address(address: str) -> None:
    """Refuse an address nobody answers at, in one line and in seconds (Ray itself retries for a minute, then prints a traceback)."""
    if address == "auto":
        return
    if address.startswith("ray://"):
        raise UserError(f"--ray-address {address}: Ray Client (ray://) is not supported; run attnbench on a node of the cluster "
                        "with the head's HOST:PORT (ray start --head prints it)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--ray-address takes HOST:PORT (what `ray start --head` prints, e.g. 10.0.0.1:6379) or 'auto': got {address!r}")
    timeout_s = connect_timeout_s()
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except TimeoutError:
        raise UserError(f"no Ray cluster answers at {address}: the connection was not accepted within {timeout_s:g} s "
                        f"(a firewall dropping it?; {CONNECT_TIMEOUT_ENV} sets the bound)") from None
    except OSError as exc:
        raise UserError(f"no Ray cluster answers at {address}: {exc.strerror or exc}") from None
    with sock:
        # ray.init waits without end on a server that accepts and never speaks gRPC (and holds its output back):
        # so the first words of the handshake are asked for here, under the bound. With TLS they are encrypted: not asked.
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            _check_speaks_grpc(sock, address, timeout_s)


def connect_timeout_s() -> float:
    """The bound on reaching --ray-address: CONNECT_TIMEOUT_S, or CONNECT_TIMEOUT_ENV's seconds when set."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return CONNECT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise UserError(f"{CONNECT_TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


def _check_speaks_grpc(sock: socket.socket, address: str, timeout_s: float) -> None:
    """Send the HTTP/2 preface and wait (at most `timeout_s`) for the SETTINGS frame a gRPC server answers with; else UserError."""
    not_ray = f"--ray-address {address} is not a Ray cluster's address"
    hint = "give the head's GCS HOST:PORT that `ray start --head` prints (port 6379 by default)"
    deadline = time.monotonic() + timeout_s
    head = b""
    try:
        sock.sendall(_H2_PREFACE)
        while len(head) < 9:  # a frame header: length (3), type (1), flags (1), stream (4)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(9 - len(head))
            if not chunk:
                raise UserError(f"{not_ray}: it accepted the connection, then closed it without answering; {hint}")
            head += chunk
    except TimeoutError:
        raise UserError(f"{not_ray}: it accepted the connection but sent nothing within {timeout_s:g} s "
                        f"(Ray's GCS answers at once; {CONNECT_TIMEOUT_ENV} sets the bound); {hint}") from None
    except OSError as exc:  # reset, broken pipe: it hung up on us
        raise UserError(f"{not_ray}: it accepted the connection, then closed it without answering ({exc.strerror or exc}); {hint}") from None
    if head.startswith(b"HTTP/"):
        raise UserError(f"{not_ray}: it answers in HTTP/1 (a web server, such as Ray's dashboard on 8265), not in Ray's gRPC; {hint}")
    if head[3] != _H2_SETTINGS:
        raise UserError(f"{not_ray}: what it answered ({head[:9]!r}) is not gRPC, which Ray's GCS speaks; {hint}")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object the driver wrote (a node's env or peaks), or {} when there is none that reads as one."""
    try:
        data = parse_json(read_regular(path, "node document", MAX_DOCUMENT_BYTES), path)
    except UserError:  # absent, not a regular file, too large or not JSON: the driver writes it anew
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
