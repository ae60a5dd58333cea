"""gapless dashboard: the Streamlit entry point, `streamlit run app.py`.

Owns the page list (st.navigation, in the top bar so the pages keep the full width; the
Live page first) and what every page shows before its own content: the banner
(ui/widgets/banner.py: the engine's actual settings, a hung engine, a running benchmark),
drawn over the one engine process the dashboard shares (ui/engine_link.py). A dead engine's
page stops at its restart message. The pages themselves live in ui/pages/.

It must never draw from a thread other than the script's, and never reach the engine except
through ui/engine_link.py.
"""

from __future__ import annotations

from pathlib import Path

# Imported whole before any page draws: Plotly looks pandas up in sys.modules without
# importing it, and while another tab's first run is still importing it, a figure built
# there would find it half made ("partially initialized module 'pandas'"). An import waits
# for the one under way to finish.
import pandas  # noqa: F401
import streamlit as st

from ui.engine_link import engine_client
from ui.pages.live import live_page
from ui.widgets.banner import status_banner
from ui.widgets.conversation import show_conversation
from ui.widgets.fragments import run_page

FAVICON = Path(__file__).resolve().parent / "ui" / "frontend" / "favicon.png"
TOP_PADDING = "4rem"


def main() -> None:
    # A local icon: a ":material/..." favicon is fetched from fonts.gstatic.com.
    st.set_page_config(page_title="gapless", page_icon=str(FAVICON), layout="wide")
    pages = [
        st.Page(live_page, title="Live", icon=":material/monitoring:", default=True),
        st.Page("ui/pages/playground.py", title="Playground", icon=":material/chat:"),
        st.Page("ui/pages/benchmark.py", title="Benchmark", icon=":material/speed:"),
        st.Page("ui/pages/ab.py", title="A/B", icon=":material/compare:"),
        st.Page("ui/pages/recordings.py", title="Recordings", icon=":material/folder_open:"),
        st.Page("ui/pages/diff.py", title="Diff", icon=":material/difference:"),
        st.Page("ui/pages/requests.py", title="Requests", icon=":material/list:"),
        st.Page("ui/pages/anatomy.py", title="Step anatomy", icon=":material/biotech:"),
    ]
    page = st.navigation(pages, position="top")
    # Less empty space under the top bar, so the timeline fits a 1280x800 window unscrolled.
    st.html(f"<style>.stMainBlockContainer {{ padding-top: {TOP_PADDING}; }}</style>")
    if page.title not in ("Recordings", "Diff"):  # recordings need no engine to open
        # A dead engine stops here, at its restart message: the Playground's conversation
        # (a reply the death cut included) stays in view under it.
        kept = show_conversation if page.title == "Playground" else None
        if not run_page(lambda: status_banner(engine_client(kept_when_dead=kept))):
            return  # a normal end: Streamlit then drops the fragments this run did not draw
    page.run()


main()
