"""Open an HTML report in headless Chromium and read back what its JavaScript saw."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

PROBE_HEAD = "<script>window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message))});</script>"
PROBE_TAIL = """<script>setTimeout(function(){var res={errors:window.__errors,figures:[]};
document.querySelectorAll('.js-plotly-plot').forEach(function(d){var n=0;(d._fullData||[]).forEach(function(t){
/* plotly.js sets _length to the number of points it drew from (typed or plain) arrays */
if(t.visible!==false&&t._length>0)n++;});res.figures.push({id:d.id,title:((d.layout||{}).title||{}).text,
traces:(d._fullData||[]).length,with_data:n});});
var p=document.createElement('pre');p.id='selfcheck';p.textContent=JSON.stringify(res);document.body.appendChild(p);},500);</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def check(report: Path) -> dict:
    """JS errors and per-figure trace counts, as the page's own scripts saw them."""
    html = report.read_text()
    html = html.replace("<head>", "<head>" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "</body>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "probe.html"
        page.write_text(html)
        out = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile",
                              "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="selfcheck">(.*?)</pre>', out.stdout, re.S)
    if not m:
        raise AssertionError(f"no self-check in the rendered DOM; chromium said: {out.stderr[-2000:]}")
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(report: Path, png: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile", "--window-size=1400,2400",
                        "--virtual-time-budget=15000", f"--screenshot={png}", report.resolve().as_uri()],
                       capture_output=True, timeout=120)
