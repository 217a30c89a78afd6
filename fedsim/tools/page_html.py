"""The HTML shell of fedsim's interactive pages (report.html, compare.html,
stress.html): one self-contained file that draws a page's data with
Plotly.

A page is data plus one fixed shell. The data (:func:`render`'s ``data``) is
a JSON object: a title, a counter (rounds or runs done), notes, a table of
key figures and the sections, each a Plotly figure with its heading and
hint. The shell embeds plotly.js itself (no CDN: the page opens from
``file://`` with no network) and a short script that draws the data. The
live server (:mod:`fedsim.tools.live`) serves the same shell with
``live`` on: the script then fetches ``data.json`` every second and redraws
what changed, so a live page and the written file can never differ in what
they show of the same rows.

Text from the run (a scenario's name, a group's name) reaches the page only
through ``textContent`` and Plotly's own escaping, never as HTML.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import plotly.io as pio
from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

# The Plotly template every figure of a page is drawn with; stored once per
# page rather than once per figure (7 kB each).
TEMPLATE = "plotly_white"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; }
#counter-line { font-size: 1.1em; }
#live { color: #b35900; }
.note { background: #fff6e0; border-left: 4px solid #e0a030; padding: 0.4em 0.8em; }
.hint { color: #555; max-width: 60em; }
table { border-collapse: collapse; }
td { border-bottom: 1px solid #ddd; padding: 0.2em 1em 0.2em 0; }
.plot { width: 100%; }
"""

# Draws the page's data; with LIVE, polls data.json and redraws on change.
_SCRIPT = """
"use strict";
const LIVE = %(live)s;
let shown = null;
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}
function fill(id, items, make) {
  const box = document.getElementById(id);
  box.replaceChildren(...items.map(make));
}
function section(s) {
  let box = document.getElementById("section-" + s.id);
  if (!box) {
    box = el("section");
    box.id = "section-" + s.id;
    box.append(el("h2", s.title), el("p", s.hint, "hint"), el("p", "", "note"));
    const plot = el("div", null, "plot");
    plot.id = "plot-" + s.id;
    box.append(plot);
    document.getElementById("sections").append(box);
  }
  const note = box.querySelector(".note");
  note.textContent = s.note || "";
  note.hidden = !s.note;
  return box;
}
function draw(data) {
  document.title = data.title;
  document.getElementById("title").textContent = data.title;
  document.getElementById("subtitle").textContent = data.subtitle;
  document.getElementById("counter-label").textContent = data.counter_label;
  document.getElementById("counter").textContent = String(data.counter);
  fill("notes", data.notes, (n) => el("p", n, "note"));
  fill("summary", data.table, (row) => {
    const tr = el("tr");
    tr.append(el("td", row[0]), el("td", row[1]));
    return tr;
  });
  for (const s of data.sections) {
    section(s);
    const layout = Object.assign({}, s.figure.layout, {template: data.template});
    Plotly.react("plot-" + s.id, s.figure.data, layout,
                 {responsive: true, displaylogo: false});
  }
  shown = data.version;
}
draw(JSON.parse(document.getElementById("fedsim-data").textContent));
if (LIVE) {
  const live = document.getElementById("live");
  live.textContent = "live: updates every second while the run goes on";
  const timer = setInterval(async () => {
    try {
      const reply = await fetch("data.json", {cache: "no-store"});
      const data = await reply.json();
      if (data.version !== shown) draw(data);
    } catch (e) {
      clearInterval(timer);
      live.textContent = "live: the run ended (the server stopped); " +
        "the files beside its results hold the final page";
    }
  }, 1000);
}
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>fedsim</title>
<link rel="icon" href="data:,">
<style>%(style)s</style>
<script>%(plotly)s</script>
</head><body>
<h1 id="title"></h1>
<p id="subtitle" class="hint"></p>
<p id="counter-line"><span id="counter-label"></span>: <b id="counter"></b>
<span id="live"></span></p>
<div id="notes"></div>
<table id="summary"></table>
<div id="sections"></div>
<script type="application/json" id="fedsim-data">%(data)s</script>
<script>%(script)s</script>
</body></html>
"""


@functools.cache
def _plotly_js() -> str:
    """plotly.min.js as shipped in the plotly wheel (read once per process)."""
    return get_plotlyjs()


@functools.cache
def _template() -> dict[str, Any]:
    """:data:`TEMPLATE` as Plotly JSON."""
    template: dict[str, Any] = pio.templates[TEMPLATE].to_plotly_json()
    return template


def figure_json(fig: Any) -> dict[str, Any]:
    """A Plotly figure as the dict a page section holds: its data and
    layout, without the template (the page applies one to all).

    Args:
        fig: a ``plotly.graph_objects.Figure``.
    """
    out: dict[str, Any] = fig.to_plotly_json()
    out["layout"].pop("template", None)
    return out


def data_json(data: dict[str, Any]) -> str:
    """A page's data as JSON (NaN as null, NumPy arrays as lists), with the
    template and a ``version`` that changes whenever the content does, so a
    live page redraws only when there is something new.

    Args:
        data: the page's data (see the module's docstring).
    """
    body = to_json_plotly(data)
    version = hashlib.sha256(body.encode()).hexdigest()[:16]
    # the template is the same for every page: kept out of the version
    return to_json_plotly({**data, "template": _template(), "version": version})


def render(data: dict[str, Any], live: bool = False) -> str:
    """The page: the shell with plotly.js, ``data`` and the drawing script.

    The result depends only on ``data`` and ``live`` (no clock, no paths),
    so writing a page twice gives the same bytes.

    Args:
        data: the page's data (see the module's docstring).
        live: poll ``data.json`` and redraw (served pages only; a page
            opened from a file has no server to ask).
    """
    # Plotly's encoder writes <, > and / as \u escapes: no text of the run
    # can end the script element the data sits in (tests/test_page.py)
    payload = data_json(data)
    return _PAGE % {
        "style": _STYLE,
        "plotly": _plotly_js(),
        "data": payload,
        "script": _SCRIPT % {"live": json.dumps(live)},
    }
