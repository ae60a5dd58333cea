"""Tensor parallelism: one process per rank, Megatron-style shards of our fused Llama path.

Rank 0 is the engine process: its scheduler, CPU prep and step loop are the only ones. Each
other rank is a worker process that follows rank 0's steps (`follower.py`), started and ended
by `workers.py`; `leader.py` is rank 0's side. `shard.py` cuts the weights, `comm.py` holds the
collectives the forward calls, `group.py` the process group, `checks.py` the start-up checks,
`messages.py` the small types that cross the pipes, `timing.py` the per-rank step spans.
Nothing here schedules, and nothing imports UI code.
"""
