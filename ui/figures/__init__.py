"""Figure builders and the numbers behind them, from records: plotly and numpy, never
Streamlit (tests/test_layering.py), never the engine. ui/widgets/ and ui/pages/ draw them."""
