"""What the pages draw with Streamlit: controls, the banner, the Playground's conversation and
chat prompt, the A/B view, the live plot component and the fragments live parts run in. The
engine is reached only through ui/engine_link.py."""
