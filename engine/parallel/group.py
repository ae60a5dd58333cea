"""The process group of the tensor-parallel ranks: rendezvous, join, leave.

Owns the torch.distributed default group: gloo when the ranks run on the CPU, NCCL on CUDA
(one GPU per rank). Rank 0 (the engine process) opens a TCPStore on a free localhost port and
hands the port to the workers; every join has a timeout, so a rank that never comes is an
error, not a hang. One tensor-parallel engine per process at a time (the default group is
process-wide). Never runs a collective itself.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

HOST = "127.0.0.1"


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def open_store(world: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free localhost port (its `.port`)."""
    if dist.is_initialized():
        raise RuntimeError(
            "a tensor-parallel engine is already running in this process (the process group "
            "is process-wide); shut it down before starting another"
        )
    return dist.TCPStore(HOST, 0, world, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join(rank: int, world: int, device: torch.device, timeout_s: float,
         store: dist.TCPStore | None = None, port: int | None = None) -> None:
    """Join the group as `rank` (rank 0 passes its store, a worker the store's port)."""
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        assert port is not None
        store = dist.TCPStore(HOST, port, world, is_master=False, timeout=timeout)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world,
                            timeout=timeout, **kwargs)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
