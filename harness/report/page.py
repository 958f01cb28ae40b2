"""HTML building blocks for the report: every string that comes from data goes through `esc`.

The page is one self-contained file: inline CSS, figures as data URIs, no script, no external
resource of any kind, so it opens from file:// or any static host and fetches nothing.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1400px;margin:0 auto;padding:16px 28px 60px}
h1{font-size:24px;margin:18px 0 4px}h2{font-size:19px;margin:34px 0 8px;border-bottom:2px solid #d8dde6;padding-bottom:4px}
h3{font-size:15px;margin:20px 0 6px}p,li{max-width:1000px}.muted{color:#5b6475}
nav{background:#1d2330;padding:8px 28px;position:sticky;top:0;z-index:2}nav a{color:#dfe6f3;margin-right:16px;text-decoration:none;font-size:13px}
table{border-collapse:collapse;background:#fff;margin:6px 0 14px;font-size:12.5px}
th,td{border:1px solid #d8dde6;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f6}.scroll th{position:sticky;top:0;z-index:1}td.t,th.t{text-align:left}
.scroll{max-height:520px;overflow:auto;display:inline-block;max-width:100%}
.impossible{background:#ffd6d6;color:#8a0000;font-weight:600}.bad{background:#fff0d6}.good{background:#e2f5e4}
.card{display:inline-block;background:#fff;border:1px solid #d8dde6;border-radius:6px;padding:8px 14px;margin:0 10px 10px 0;vertical-align:top}
.card b{display:block;font-size:18px}.warn{background:#fff4e0;border-left:4px solid #e69500;padding:8px 12px;margin:10px 0;max-width:1000px}
figure{margin:10px 0 22px;background:#fff;border:1px solid #d8dde6;padding:8px;display:inline-block;max-width:100%}
figure img{max-width:100%;height:auto;display:block}figcaption{font-size:12px;color:#5b6475;max-width:1000px;margin-top:4px}
code{background:#eef1f6;padding:0 3px;border-radius:3px}
ul.repro pre{margin:2px 0 6px;white-space:pre-wrap;word-break:break-all}
"""


def esc(value: Any) -> str:
    """HTML-escape anything (quotes too), rendering None/NaN as an empty string."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return html.escape(str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    """A number for display (full precision stays in the CSVs): 4 significant digits, ints with separators."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (hasattr(value, "is_integer") and isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    try:
        import numpy as np

        if isinstance(value, np.integer):
            return f"{int(value):,}"
        if isinstance(value, np.floating):
            return fmt(float(value), digits)
        if isinstance(value, np.bool_):
            return "yes" if value else "no"
    except ImportError:
        pass
    return str(value)


#: A cell formatter returns the cell's text (not yet escaped) and an optional CSS class.
CellFormat = Callable[[Any, Any], tuple[str, str]]


def table(frame: pd.DataFrame, *, columns: Sequence[str] | None = None, headers: Sequence[str] | None = None,
          formats: dict[str, CellFormat] | None = None, index: bool = False, scroll: bool = True) -> str:
    """An escaped HTML table of a DataFrame; `formats[col](value, row)` may return a CSS class with the text."""
    if frame is None or frame.empty:
        return '<p class="muted">(no rows)</p>'
    frame = frame.reset_index() if index else frame
    columns = list(columns or frame.columns)
    headers = list(headers or columns)
    formats = formats or {}
    numeric = {col: pd.api.types.is_numeric_dtype(frame[col]) for col in columns}  # once per column, not per cell
    out = ['<div class="scroll"><table>' if scroll else "<table>", "<thead><tr>"]
    for col, head in zip(columns, headers):
        cls = ' class="t"' if not numeric[col] else ""
        out.append(f"<th{cls}>{esc(head)}</th>")
    out.append("</tr></thead><tbody>")
    for _, row in frame.iterrows():
        out.append("<tr>")
        for col in columns:
            value = row[col]
            if col in formats:
                text, cls = formats[col](value, row)
            else:
                text, cls = fmt(value), ""
            classes = " ".join(c for c in (cls, "" if numeric[col] else "t") if c)
            out.append(f'<td class="{esc(classes)}">{esc(text)}</td>' if classes else f"<td>{esc(text)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>" if scroll else "</tbody></table>")
    return "".join(out)


def figure(title: str, data_uri: str, caption: str = "") -> str:
    """An embedded PNG with an escaped alt text and caption."""
    if not data_uri.startswith("data:image/png;base64,"):
        raise ValueError("figures must be embedded PNG data URIs")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{esc(data_uri)}" alt="{esc(title)}">{cap}</figure>'


def commands(title: str, rows: Iterable[tuple[str, Any]]) -> str:
    """A folded list of shell commands, each under its label (rows without a command are left out; nothing when none has one)."""
    items = [f"<li>{esc(label)}<pre><code>{esc(command)}</code></pre></li>" for label, command in rows if isinstance(command, str) and command]
    if not items:
        return ""
    return f'<details><summary>{esc(title)}</summary><ul class="repro">{"".join(items)}</ul></details>'


def section(anchor: str, title: str, body: Iterable[str]) -> str:
    """A titled section with an anchor for the navigation bar (anchor and title are escaped)."""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{"".join(body)}</section>'


def page(title: str, nav: Sequence[tuple[str, str]], sections: Sequence[str], heading: str = "") -> str:
    """The whole document: navigation, an optional pre-built heading block, then the sections."""
    links = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in nav)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<nav>{links}</nav><main>{heading}{''.join(sections)}</main></body></html>\n"
    )
