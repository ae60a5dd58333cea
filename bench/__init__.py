"""Reproducible benchmarks: one harness (`python -m bench SUITE`), one module per suite.

bench/harness/ holds what every suite shares (workloads, model shapes, the byte floor, timing,
tables and results folders); bench/suites/ holds one module per measurement. Nothing under
engine/ or telemetry/ imports bench/.
"""
