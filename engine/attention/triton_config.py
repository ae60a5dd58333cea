"""Launch configuration of the Triton paged attention kernel, chosen from shapes only.

Owns `LaunchConfig` (split-K factor, the fewest key tiles a split takes, key tile size, warps,
pipeline depth, block-table prefetch), `choose_config` (the default per shape),
and `pdl_available`, whether programmatic dependent launch can be used here.

Every decision reads shapes, dtypes and the device, never tensor values, so a CUDA graph
captured with one configuration stays right whatever the contexts are at replay. The context
length is a value, so it is the kernel that adapts to it: a split takes at least `min_tiles`
key tiles, and the splits a short context leaves empty exit at once (and then no split
combine runs either). Never imports the kernel module (the benchmark imports this one to
list candidates on any machine).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

# Split while (query block, kv head) programs fill fewer than this many per SM: once every SM
# has a program, one split is fastest (docs/benchmarks.md, "Paged attention kernel"); small
# batches of few kv heads want more.
PROGRAMS_PER_SM_TARGET = 1
MAX_SPLITS = 16
# A split streams at least this many keys (at least one tile). One tile a split is fastest
# wherever splitting pays (docs/benchmarks.md): short decodes are latency-bound, and more
# splits shorten the chain.
MIN_KEYS_PER_SPLIT = 0

# Batches of at most this many tokens are decode-sized (see choose_config).
DECODE_TOKENS = 256


class LaunchConfig(NamedTuple):
    num_splits: int  # grid size along the keys; splits a short context leaves empty exit
    min_tiles: int  # fewest key tiles one split takes (caps the splits at short contexts)
    block_n: int  # keys per tile, power of two >= 16
    num_warps: int
    num_stages: int
    # Block-table entries one tile ahead (in registers), so K/V tiles are multi-buffered
    # (num_stages - 1 in flight, more shared memory) rather than one at a time.
    table_ahead: bool = False

    def label(self) -> str:
        return (f"s{self.num_splits}/m{self.min_tiles}/n{self.block_n}/"
                f"w{self.num_warps}/st{self.num_stages}" + ("/ahead" if self.table_ahead else ""))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere."""
    if device.type != "cuda":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def default_block_n(head_dim: int, elem_size: int = 2) -> int:
    """128-key tiles measured best for 16-bit D=128; keep K+V stages within shared memory."""
    row_bytes = head_dim * elem_size
    return 128 if row_bytes <= 256 else 64 if row_bytes <= 512 else 32


def default_num_splits(programs: int, sms: int) -> int:
    """Smallest power of two that gives every SM PROGRAMS_PER_SM_TARGET programs."""
    splits = 1
    while splits < MAX_SPLITS and max(1, programs) * splits < PROGRAMS_PER_SM_TARGET * sms:
        splits *= 2
    return splits


def choose_config(
    *, tokens: int, kv_heads: int, head_dim: int, elem_size: int, device: torch.device
) -> LaunchConfig:
    """The default launch for a batch of `tokens` query tokens on `device`."""
    block_n = default_block_n(head_dim, elem_size)
    splits = (default_num_splits(tokens * kv_heads, sm_count(device))
              if device.type == "cuda" else 1)
    # A decode-sized batch at one split streams K/V with 64-key tiles, two in flight
    # (table_ahead): the fastest launch at every one-split shape `python -m bench attention`
    # sweeps. Up to DECODE_TOKENS is the same program shape (one query token each), more of
    # them. Prefill chunks and split launches keep 128 keys.
    ahead = splits == 1 and tokens <= DECODE_TOKENS and head_dim * elem_size <= 256
    return LaunchConfig(
        num_splits=splits,
        min_tiles=max(1, MIN_KEYS_PER_SPLIT // block_n),
        block_n=64 if ahead else block_n,
        # 4 warps: fewer registers per program than 8 at 128-key tiles, so more programs per SM
        # (the 8-warp launch with the split merge compiled in fits one program per SM).
        num_warps=4,
        num_stages=3,
        table_ahead=ahead,
    )


def pdl_available(device: torch.device) -> bool:
    """PDL needs a real (not interpreted) Triton with grid-dependency control and sm_90+.
    The one check of it: the attention and the fused kernels (engine/model/pdl_launch.py)
    both ask here. Cheap after the first call per device (launches ask it each time)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return _pdl_on(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _pdl_on(index: int) -> bool:
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions

        if not (hasattr(tl.extra.cuda, "gdc_wait")
                and hasattr(tl.extra.cuda, "gdc_launch_dependents")):
            return False
        if "launch_pdl" not in CUDAOptions.__dataclass_fields__:  # the launch option
            return False
    except Exception:
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9
