"""Dashboard building blocks: plotly figures, table rows and the shared engine client.

Figure and table modules (timeline, gauges, histograms) are pure functions of telemetry
records, tested without a browser or an engine. ui/ imports the engine only through
engine.client, engine.config, engine.loadgen and engine.workload (docs/engine-client-api.md),
and engine/ never imports ui/.
"""
