"""`attnbench site`: a static site of many runs from the results database's two frames (runs, rows).

Opens from disk with no server: every page is self-contained (figures are embedded PNGs), each run's report is
rebuilt from the database alone, and a build problem of one run is listed beside it rather than failing the site.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pandas as pd

from harness.analysis.difference import order
from harness.analysis.trust import untrusted
from harness.analysis.winners import no_winner_reason
from harness.report.canvas import backend_colors, new_figure, plain, to_data_uri
from harness.report.page import esc, figure, page, section

#: At most this many trend figures per device model; the rest are counted, not drawn.
MAX_FIGURES = 60


def slug(text: object) -> str:
    """A file-name-safe slug of any text."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-.") or "unknown"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_report(run: pd.Series, rows: pd.DataFrame, out: Path) -> tuple[str | None, str]:
    """Rebuild one run's report from its stored documents; (relative link, '') or (None, one-line reason)."""
    from harness.report import build_report

    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / slug(run["run_id"] or run["run_uuid"])
            folder.mkdir()
            for name, column in (("manifest.json", "manifest_json"), ("env.json", "env_json"), ("peaks.json", "peaks_json")):
                if isinstance(run.get(column), str):
                    (folder / name).write_text(run[column])
            (folder / "records.jsonl").write_text("".join(r + "\n" for r in rows["record_json"] if isinstance(r, str)))
            path = build_report([folder], out_root=out / "runs")
        return path.relative_to(out).as_posix(), ""
    except Exception as exc:  # one run's report is never worth the whole site
        return None, (str(exc).splitlines() or [type(exc).__name__])[0]


def _trusted(row: pd.Series) -> bool:
    return not bool(untrusted(pd.DataFrame([row])).iloc[0])


def changes(series: pd.DataFrame) -> list[tuple[int, float]]:
    """(position, ratio) of each real change between consecutive trusted runs of one (case, backend), oldest first."""
    found, last = [], None
    for i, (_, row) in enumerate(series.iterrows()):
        if not _trusted(row) or row.get("status") != "ok":
            continue
        if last is not None and order(row, last) != 0:
            found.append((i, float(row["latency_ms_median"]) / float(last["latency_ms_median"])))
        last = row
    return found


def _trend_figure(case: str, frame: pd.DataFrame, colors: dict, marks: list[str]) -> str:
    """One small figure of a case's latency over runs, a line per backend, real changes ringed in red."""
    fig = new_figure(5.0, 2.6, constrained=True)
    ax = fig.add_subplot(1, 1, 1)
    for backend, series in frame.groupby("backend", sort=True):
        series = series.sort_values("created_utc")
        x = list(range(len(series)))
        y = series["latency_ms_median"].astype(float)
        low = (y - series["latency_ms_ci95_low"].astype(float)).clip(lower=0)
        high = (series["latency_ms_ci95_high"].astype(float) - y).clip(lower=0)
        ax.errorbar(x, y, yerr=[low.fillna(0), high.fillna(0)], marker="o", ms=3, label=plain(backend), color=colors.get(backend))
        for i, ratio in changes(series):
            ax.plot([x[i]], [y.iloc[i]], "o", ms=10, mfc="none", mec="red")
            marks.append(_table_row_change(case, backend, series.iloc[i], ratio))
    ax.set_title(plain(case[:60]), fontsize=8)
    ax.set_ylabel("latency ms")
    ax.set_xlabel("run (oldest → newest)")
    ax.legend(fontsize=6)
    return figure(case, to_data_uri(fig), "median with 95 % interval; red ring: a change the rule calls real")


def _table_row_change(case: str, backend: str, row: pd.Series, ratio: float) -> str:
    word = f"slower {ratio:.2f}×" if ratio > 1 else f"faster {1 / ratio:.2f}×"
    return f"<tr><td>{esc(case)}</td><td>{esc(backend)}</td><td>{esc(word)} at run {esc(row['run_id'])}</td></tr>"


def _winners(runs: pd.DataFrame, rows: pd.DataFrame) -> list[list[str]]:
    """Per case: the fastest ok, agreeing, trusted row of the newest run having that case ('only candidate' when it ran alone), or 'no winner: …'."""
    out = []
    for case, frame in rows.groupby("case_id", sort=True):
        newest = frame.sort_values("created_utc").iloc[-1]["run_uuid"]
        latest = frame[frame["run_uuid"] == newest]
        good = latest[(latest["status"] == "ok") & (latest["agree"] == True) & ~untrusted(latest)]  # noqa: E712
        run_id = esc(latest.iloc[0]["run_id"])
        if good.empty:
            out.append([esc(case), esc(f"no winner: {no_winner_reason(latest)}"), "", run_id])
        else:
            best = good.sort_values("latency_ms_median").iloc[0]
            # A backend that ran alone beat nothing: named as the report and recommend name it, never as a winner.
            name = best["backend"] if len(good) > 1 else (
                f"only candidate: {best['backend']} (the one backend that ran, agreed and carries no flag: not a win)")
            out.append([esc(case), esc(name), esc(f"{float(best['latency_ms_median']):.4g}"), run_id])
    return out


def _policy(model: str, runs: pd.DataFrame, rows: pd.DataFrame) -> str:
    """The device's policy as `attnbench policy --db` builds it from these runs now: bucket → choice, margin, evidence; gaps."""
    from harness.policy.build import build_policy, table_rows
    from harness.policy.sources import runs_from_stored

    loaded, unread = [], []
    for _, run in runs.iterrows():
        try:
            loaded += runs_from_stored(run.to_frame().T, rows)
        except Exception as exc:  # one run's stored documents are never worth the whole site: it is named, left out of the policy
            unread.append(f"{run['run_id']} ({(str(exc).splitlines() or [type(exc).__name__])[0]})")
    left = f"<p>Left out of the policy, unreadable: {esc('; '.join(unread))}.</p>" if unread else ""
    held = build_policy(loaded)["devices"].get(model) if loaded else None
    if not held:
        return left + "<p>No attention-core row on this device: no policy.</p>"
    lines = table_rows(held)
    intro = left + (f"<p>{len(held['buckets'])} buckets answered, {len(held['gaps'])} gaps, from {len(loaded)} of the runs below (trusted rows only; "
             "the margin is judged by compare's rule). The same policy as JSON: <code>attnbench policy --db DB --out policy.json</code> "
             "(docs/policy.md); it changes as runs are added.</p>")
    headers = ["bucket", "choice", "margin", "evidence", "SDPA kernel order"]
    return intro + _table(headers, [[esc(line[h]) for h in headers] for line in lines])


def _device_page(model: str, runs: pd.DataFrame, rows: pd.DataFrame, out: Path) -> str:
    """Write trends/<slug>.html for one device model; return its relative path."""
    colors = backend_colors(sorted(set(rows["backend"])))
    figures, marks = [], []
    cases = sorted(set(rows["case_id"]))
    for case in cases[:MAX_FIGURES]:
        figures.append(_trend_figure(case, rows[rows["case_id"] == case], colors, marks))
    left = f"<p>{len(cases) - MAX_FIGURES} more cases left out (cap {MAX_FIGURES}).</p>" if len(cases) > MAX_FIGURES else ""
    change_table = ("<table><thead><tr><th>case</th><th>backend</th><th>change</th></tr></thead><tbody>" + "".join(marks)
                    + "</tbody></table>") if marks else "<p>No change the rule calls real (contended/suspect rows never count).</p>"
    winners = _table(["case", "winner", "latency ms", "run"], _winners(runs, rows))
    body = [section("changes", "Changes", [change_table]), section("winners", "Latest winners", [winners]),
            section("policy", "Policy", [_policy(model, runs, rows)]), section("trends", "Trends", [left, *figures])]
    path = out / "trends" / f"{slug(model)}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(f"attnbench trends: {model}", [("changes", "Changes"), ("winners", "Winners"), ("policy", "Policy"), ("trends", "Trends")], body,
                         heading=f"<h1>Trends on {esc(model)}</h1><p><a href=\"../index.html\">all runs</a></p>"))
    return path.relative_to(out).as_posix()


def _csv(run: pd.Series, rows: pd.DataFrame, out: Path) -> str:
    """Write csv/<device>/<suite>_<date>.csv (the row columns but record_json); return its relative path."""
    date = str(run["created_utc"] or "undated")[:10]
    path = out / "csv" / slug(run["device_model"]) / f"{slug(run['suite'])}_{slug(date)}.csv"
    if path.exists():  # two runs of a suite on one day: keep both
        path = path.with_name(f"{path.stem}_{slug(run['run_id'])}.csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.drop(columns=["record_json"], errors="ignore").to_csv(path, index=False)
    return path.relative_to(out).as_posix()


def _cudnn(env_json: object) -> str:
    return str(((json.loads(env_json) if isinstance(env_json, str) else {}).get("before") or {}).get("cudnn") or "")


#: The title every site's index page has, and so how an earlier site is told from another folder.
TITLE = "attnbench site"
#: What a site holds at its top: an earlier site holding anything else (a user's file) is not replaced.
SITE_ENTRIES = frozenset({"index.html", "trends", "runs", "csv"})


def is_site(folder: Path) -> bool:
    """Whether `folder` is a site this module wrote, holding nothing else at its top."""
    from harness.results.outputs import page_title_is

    return page_title_is(folder / "index.html", TITLE) and {entry.name for entry in folder.iterdir()} <= SITE_ENTRIES


def check_site_out(out: Path) -> Path:
    """Refuse (UserError) a --out that is or lies in a run folder, is a file or a link, or holds anything but an earlier site."""
    from harness.results.outputs import check_output_folder

    return check_output_folder(Path(out), "a site", is_site)


def build_site(runs: pd.DataFrame, rows: pd.DataFrame, out: Path) -> Path:
    """Write the static site (index, per-device trends, run reports, dated CSVs) as `out`, built beside it and renamed into place
    (an earlier site is replaced whole, never left half-written); return index.html."""
    from harness.results.outputs import replace_folder

    out = check_site_out(Path(out))
    with replace_folder(out) as building:
        _write_site(runs, rows, building)
    return out / "index.html"


def _write_site(runs: pd.DataFrame, rows: pd.DataFrame, out: Path) -> None:
    """Write every page and CSV of the site under `out` (a new, empty folder)."""
    runs = runs.sort_values("created_utc", na_position="first")
    meta = runs[["run_uuid", "run_id", "created_utc", "device_model"]]
    rows = rows.merge(meta, on="run_uuid", how="inner")
    sections, nav = [], []
    for model, group in runs.groupby("device_model", sort=True):
        trend = _device_page(str(model), group, rows[rows["device_model"] == model].sort_values("created_utc"), out)
        cells = []
        for _, run in group.iterrows():
            own = rows[rows["run_uuid"] == run["run_uuid"]]
            link, reason = _run_report(run, own, out)
            report = f'<a href="{esc(link)}">report</a>' if link else f"no report: {esc(reason)}"
            csv = _csv(run, own[[c for c in own.columns if c not in ("run_id", "created_utc", "device_model")]], out)
            cells.append([esc(str(run["created_utc"] or "")[:19]), esc(run["run_id"]), esc(run["suite"]), esc(str(run["harness_commit"] or "")[:10]),
                          esc(run["harness_version"]), esc(run["torch"]), esc(run["torch_cuda"]), esc(run["cudnn"] or _cudnn(run["env_json"])),
                          esc(f"{run['rows_ok']}/{run['rows']}"), report, f'<a href="{esc(csv)}">csv</a>'])
        anchor = slug(model)
        nav.append((anchor, str(model)))
        sections.append(section(anchor, str(model), [f'<p><a href="{esc(trend)}">trends, changes and latest winners</a></p>',
                                                     _table(["created", "run", "suite", "commit", "harness", "torch", "CUDA", "cuDNN",
                                                             "rows ok", "report", "CSV"], cells)]))
    (out / "index.html").write_text(page(TITLE, nav, sections or [section("none", "No runs", ["<p>The database holds no run.</p>"])],
                                         heading="<h1>attnbench runs</h1>"))
