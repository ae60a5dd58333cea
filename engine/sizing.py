"""How big the engine's memory is, and whether it fits, decided before anything is allocated.

Owns the number of KV blocks (explicit, or from the GPU's free memory) and the check that
the KV cache plus the token table fit in the memory there is: a size that cannot fit is a
ValueError with the bytes needed and available, never a bare MemoryError minutes later.
Never allocates.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.block_allocator import blocks_needed
from engine.model.hf_config import kv_cache_shape


def kv_bytes_per_block(hf_config: Any, block_size: int, dtype: torch.dtype,
                       tp_size: int = 1) -> int:
    """Bytes of one KV block on one rank (its share of the KV heads)."""
    layers, kv_heads, head_dim = kv_cache_shape(hf_config, tp_size)
    elem = torch.tensor([], dtype=dtype).element_size()
    return 2 * layers * block_size * kv_heads * head_dim * elem


def num_blocks_for(cfg: EngineConfig, hf_config: Any, max_model_len: int,
                   device: torch.device, dtype: torch.dtype, tp_size: int = 1) -> int:
    """Every KV block the runner allocates, the scratch block included (the same count on
    every tensor-parallel rank; each rank holds its share of the KV heads)."""
    per_req = blocks_needed(max_model_len, cfg.block_size)
    enough = cfg.max_num_seqs * per_req + 1
    if cfg.num_blocks is not None:
        n = cfg.num_blocks
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        per_block = kv_bytes_per_block(hf_config, cfg.block_size, dtype, tp_size)
        n = min(enough, int(free * cfg.gpu_memory_fraction) // per_block)
    else:
        n = enough
    if n - 1 < per_req:
        raise ValueError(
            f"num_blocks={n} is too small: one request of max_model_len="
            f"{max_model_len} needs {per_req} blocks of {cfg.block_size} tokens "
            f"(plus one scratch block); give num_blocks >= {per_req + 1}"
        )
    return n


def available_bytes(device: torch.device) -> int:
    """Free GPU memory on CUDA; physical memory on the CPU (psutil is not a dependency)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(cfg: EngineConfig, hf_config: Any, num_blocks: int, max_model_len: int,
               device: torch.device, dtype: torch.dtype, tp_size: int = 1) -> None:
    kv = num_blocks * kv_bytes_per_block(hf_config, cfg.block_size, dtype, tp_size)
    table = (cfg.max_num_seqs + 1) * (max_model_len + 1) * 8  # int64 token table
    need, have = kv + table, available_bytes(device)
    if need > have:
        raise ValueError(
            f"the KV cache (num_blocks={num_blocks} x block_size={cfg.block_size}) and the "
            f"token table (max_num_seqs={cfg.max_num_seqs} x max_model_len={max_model_len}) "
            f"need {_gib(need)}, but {device.type} memory has {_gib(have)} "
            f"{'free' if device.type == 'cuda' else 'in all'}; lower num_blocks, "
            "max_model_len or max_num_seqs"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} bytes)"
