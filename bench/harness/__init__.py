"""What every benchmark suite shares: workloads and model shapes (workload, shapes), the byte
floor (floor), cuda-synced timing and alternated A/B pairs (timing), tables and results
folders (report), and the multi-suite device call (runner). Never imports a suite.
"""
