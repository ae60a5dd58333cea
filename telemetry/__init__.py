"""Telemetry: what the engine measures about itself and how it reaches the dashboard.

Owns span/step/request records, the bounded bus between the engine thread and readers (and a
collector that keeps a whole run), host clock alignment for device events, the NVML and GPM
samplers, pure metrics over records (busy, idle by cause, predicted async gain, step anatomy
from a kernel recording), and exporters (Chrome trace, JSON lines). It must never import
engine/, ui/ or any UI library (streamlit, plotly): telemetry/ is the bottom of the
dependency graph.

Submodules are imported explicitly (``from telemetry.bus import TelemetryBus``) so that
importing one part never pulls in numpy or pynvml for another.
"""
