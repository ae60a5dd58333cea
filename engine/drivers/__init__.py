"""Programs that drive an engine: the load generator and the benchmark workload.

Their spec and result value types import without torch (the dashboard sends them to the
engine process through the client); the Engine itself is imported for typing only.
"""
