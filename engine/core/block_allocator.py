"""The paged KV cache's block allocator: a free list and per-request ownership.

Owns which physical block belongs to whom. Never touches the cache tensors themselves.
"""

from __future__ import annotations


class BlockAllocator:
    """Hands out fixed-size KV blocks. Block ids are 0..num_blocks-1."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        # Pop from the end: low ids first, so small workloads touch a compact region.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, only {len(self._free)} free")
        blocks = [self._free.pop() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if b not in self._used:
                raise RuntimeError(f"KV block {b} freed twice or never allocated")
            self._used.remove(b)
            self._free.append(b)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)
