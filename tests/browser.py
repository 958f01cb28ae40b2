"""The report opened in headless Chromium with a probe script: script errors, images that did not load, tables and sections."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path


def chromium() -> str | None:
    """The path of a Chromium-like browser on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


PROBE = """<script>
window.__e=[];
window.addEventListener('error',function(e){window.__e.push(String(e.message||(e.target&&(e.target.src||'').slice(0,40))||'error'))},true);
window.addEventListener('unhandledrejection',function(e){window.__e.push('rejection: '+e.reason)});
console.error=function(){window.__e.push('console.error: '+Array.prototype.join.call(arguments,' '))};
window.addEventListener('load',function(){var im=Array.from(document.images);
var r={errors:window.__e,images:im.length,zero_width:im.filter(function(i){return !(i.complete&&i.naturalWidth>0)}).length,
tables:document.querySelectorAll('table').length,sections:Array.from(document.querySelectorAll('section')).map(function(s){return s.id})};
var p=document.createElement('pre');p.id='attnbench-probe';p.textContent=JSON.stringify(r);document.body.appendChild(p);});
</script>"""


def browse(html_path: Path, tmp_path: Path) -> tuple[dict, str]:
    """Open a copy of the page with a probe script in headless Chromium; return the probe's findings and the console log."""
    probed = html_path.parent / f"probe-{html_path.name}"
    probed.write_text(html_path.read_text().replace("<head>", "<head>" + PROBE, 1))
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", "--dump-dom", probed.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    probed.unlink()
    match = re.search(r'<pre id="attnbench-probe">([^<]*)</pre>', done.stdout)
    assert match, f"the probe did not run: {done.stderr[-500:]}"
    console = "\n".join(line for line in done.stderr.splitlines() if "CONSOLE" in line)
    import html as html_module

    return json.loads(html_module.unescape(match.group(1))), console
