"""The engine in its own process, and its clients.

wire.py (the protocol both sides share), server.py + commands.py + links.py + pump.py (the
engine process: commands, one link per connected client, the telemetry / NVML / heartbeat
thread), endpoint.py (the private Unix socket other clients attach to), spawn.py (starting
the process), session.py + streams.py (one connection seen from a client), status.py (errors
and status), timeouts.py (the client's time limits), client.py (EngineClient, the API of
docs/engine-client-api.md).

Never imports streamlit or ui/; the dashboard's only door into the engine is
engine.process.client.
"""
