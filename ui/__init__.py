"""Dashboard building blocks: plotly figures, table rows and the shared engine client.

Figure and table modules (timeline, gauges, histograms) are pure functions of telemetry
records, tested without a browser or an engine. ui/ imports the engine only through
engine.process.client, engine.config, engine.drivers.loadgen and engine.drivers.workload
(docs/engine-client-api.md), and engine/ never imports ui/.
"""
