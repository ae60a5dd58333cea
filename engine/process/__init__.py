"""The engine in its own process: the server (child side), the session (parent side of the
pipe), the client API on top of it, and the wire format both sides share.

Never imports streamlit or ui/; the dashboard's only door into the engine is
engine.process.client.
"""
