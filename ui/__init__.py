"""The dashboard: ui/pages/ (one script per page, which app.py's navigation runs; not named
pages/ at the top, where Streamlit would also serve them as pages of its own, without the
navigation, to a tab opened on a page's URL), ui/figures/ (pure figure builders over
telemetry records: no Streamlit, tested without a browser or an engine), ui/widgets/ (what
draws with Streamlit) and ui/engine_link.py (the one shared engine client and what a page
shows when its engine is dead or hung; ui/http_sidecar.py starts the HTTP API beside it).
The dashboard imports the engine only through the doors tests/test_layering.py lists
(docs/engine-client-api.md), and engine/ never imports ui/.
"""
