"""The runs a policy is built from, and validated on: run folders, or runs in the results database, each as the analysis frame.

A run is kept apart from the others until a policy is built (`combined`), so that leave-one-run-out can rebuild the policy
without one of them. Each run carries what its evidence names: its id, device model, attnbench commit and library versions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from harness.errors import UserError

#: The libraries a policy's evidence names, from each run's env.json (`before`), beside torch.
LIBRARIES = ("torch", "torch_cuda", "cudnn", "xformers", "flash_attn", "flashinfer", "triton", "python")


@dataclass
class LoadedRun:
    """One run's analysis frame (harness.analysis.frame), and what a policy's evidence says of it."""

    run_id: str
    frame: pd.DataFrame
    #: run_id, device model, attnbench version and commit, library versions.
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[str]:
        """The device models the run's rows were measured on (one, but for a mixed Ray cluster)."""
        return sorted(set(self.frame["device_model"].astype(str)))


def run_meta(run_id: str, env: Mapping[str, Any] | None, manifest: Mapping[str, Any] | None, frame: pd.DataFrame) -> dict[str, Any]:
    """What a policy names of a run: its id, device models, attnbench version and commit, and library versions."""
    before = (env or {}).get("before") or {}
    manifest = manifest or {}

    def first(name: str) -> Any:
        values = frame[name].dropna() if name in frame.columns else ()
        return values.iloc[0] if len(values) else None

    libraries = {name: str(before[name]) for name in LIBRARIES if before.get(name) is not None}
    return {"run_id": run_id, "devices": sorted(set(frame["device_model"].astype(str))),
            "harness_version": manifest.get("harness_version") or before.get("harness_version") or first("harness_version"),
            "harness_commit": manifest.get("harness_commit") or before.get("harness_commit") or first("harness_commit"),
            "created_utc": manifest.get("created_utc") or before.get("time_utc"), "libraries": libraries}


def load_folders(paths: Sequence[Path | str]) -> list[LoadedRun]:
    """Each run folder as its own analysis frame (UserError, one line, for a folder that is not a run)."""
    from harness import analysis

    return [run for path in paths for run in runs_of(analysis.load([Path(path)]))]


def _document(text: Any) -> dict:
    """A stored JSON document (env, manifest), or {} where the database holds none."""
    return json.loads(text) if isinstance(text, str) and text else {}


def runs_from_stored(stored: pd.DataFrame, rows: pd.DataFrame) -> list[LoadedRun]:
    """Each stored run (a `runs_frame` row, with its env and manifest) and its stored rows (`rows_frame`) as an analysis frame."""
    from harness.analysis.frame import by_device_model, declared_capabilities, derive_columns

    runs = []
    for _, run in stored.iterrows():
        own = rows[rows["run_uuid"] == run["run_uuid"]]
        if own.empty:
            continue
        records = pd.DataFrame([json.loads(text) for text in own["record_json"]])
        run_id = str(run["run_id"])
        records["run_id"] = run_id
        env, manifest = _document(run.get("env_json")), _document(run.get("manifest_json"))
        frame = by_device_model(records, {run_id: env})
        frame = derive_columns(frame, declared_capabilities(sorted(set(frame["backend"])), [manifest]))
        meta = run_meta(run_id, env, manifest, frame)
        meta["harness_commit"] = meta["harness_commit"] or run.get("harness_commit")
        runs.append(LoadedRun(run_id, frame, meta))
    return runs


def runs_of(data: Any) -> list[LoadedRun]:
    """The runs of an `analysis.load` result (harness.analysis.frame.RunData), each as its own LoadedRun."""
    return [LoadedRun(str(run_id), sub, run_meta(str(run_id), data.env.get(run_id), data.manifests.get(run_id), sub))
            for run_id, sub in data.frame.groupby("run_id", sort=False)]


def combined(runs: Sequence[LoadedRun]) -> pd.DataFrame:
    """The runs' rows as one frame, one row per (case, device model, backend): the last run's unflagged row (analysis.load's rule)."""
    from harness.analysis.frame import one_row_per_pair

    if not runs:
        raise UserError("give at least one run folder (or --db with runs in it)")
    frame = pd.concat([run.frame for run in runs], ignore_index=True) if len(runs) > 1 else runs[0].frame
    return one_row_per_pair(frame)[0]
