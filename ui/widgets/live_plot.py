"""A Plotly chart that updates in place: a Streamlit custom component around one Plotly div.

``st.plotly_chart`` rebuilds the chart in the browser whenever its data changes (docs/design.md
§7): zoom is lost and a redraw can show a blank frame. This component (components v1, an
iframe speaking Streamlit's component protocol) keeps one div for its whole life and applies
each new figure with ``Plotly.react``; with a constant ``layout.uirevision`` the user's zoom
and pan survive the refreshes, and new figures are held while the pointer is on the chart so
a hover label can be read (ui/frontend/live_plot.html).

Owns serving the frontend: the HTML from ui/frontend/ and plotly.js from the installed
plotly package's offline bundle, copied together into one folder outside the repository
(Streamlit serves a component's files from one folder). It must never load anything from
outside the server (no CDN), and never write into the repository.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
import plotly.io as pio

FRONTEND_HTML = Path(__file__).resolve().parents[1] / "frontend" / "live_plot.html"
COMPONENT_NAME = "live_plot"


def plotly_bundle() -> Path:
    """plotly.min.js of the installed plotly package (its offline bundle)."""
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly's offline bundle is missing: {path}")
    return path


def frontend_dir(root: Path | None = None) -> Path:
    """The folder Streamlit serves the component from (built once per HTML + plotly version).

    Its name carries a digest of the HTML and the plotly version, so an edited page or an
    upgraded plotly gets a fresh folder, and two servers never write the same files.
    """
    html = FRONTEND_HTML.read_bytes()
    digest = hashlib.sha256(html + plotly.__version__.encode()).hexdigest()[:12]
    folder = (root or Path(tempfile.gettempdir())) / f"gapless-live-plot-{digest}"
    bundle = plotly_bundle()
    target = folder / "plotly.min.js"
    if not (folder / "index.html").is_file() or not target.is_file() or (
        target.stat().st_size != bundle.stat().st_size
    ):
        tmp = Path(tempfile.mkdtemp(prefix="gapless-live-plot-", dir=folder.parent))
        shutil.copyfile(bundle, tmp / "plotly.min.js")
        (tmp / "index.html").write_bytes(html)
        try:
            tmp.rename(folder)  # atomic: a reader never sees half a folder
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def figure_json(fig: go.Figure | dict[str, Any]) -> bytes:
    """The figure as UTF-8 JSON (numpy arrays included), as the frontend reads it."""
    if isinstance(fig, dict):
        fig = go.Figure(fig)
    return pio.to_json(fig, validate=False, engine="orjson").encode()


def live_plot(fig: go.Figure, *, key: str, height_px: int) -> None:
    """Draw ``fig`` in the persistent chart named ``key`` (same key: the same div, updated).

    Give the figure a constant ``layout.uirevision`` and, for a live axis, a constant range
    (like ``[-window, 0]``), so that a user's zoom is kept across refreshes.
    """
    import streamlit.components.v1 as components

    component = components.declare_component(COMPONENT_NAME, path=str(frontend_dir()))
    payload = figure_json(fig)
    # The frontend re-renders when the JSON arguments change; bytes arguments alone do not
    # count, so a digest of the figure goes with them.
    digest = hashlib.blake2b(payload, digest_size=8).hexdigest()
    component(figure=payload, digest=digest, height=int(height_px), key=key, default=None)
