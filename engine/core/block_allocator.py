"""The paged KV cache's block allocator: reference counts, the prefix cache, deferred frees.

Owns which physical block belongs to whom, which full blocks are kept as a prefix cache, and
when a released block may be handed out again. Never touches the cache tensors themselves.

Prefix cache: a full block whose token ids are known gets a key, hash(parent's key, its token
ids, the engine's extra key: model identity). A lookup walks a prompt block by block from the
start; a hit is confirmed against the stored token ids and the stored parent (block id and the
generation of its content), never on the hash alone, so a hash collision is only a miss.
Unreferenced cached blocks stay in a least-recently-used order and are evicted only when no
never-cached block is left.

Deferred frees: a block released while a launched step may still read or write it (async
batching: the step in flight holds the request's block table) is handed out again only once
that step has completed (`launched` / `completed`, called by the step loop). It may still be
hit meanwhile: a hit only reads it, in a later step, and steps run in order on the device.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

# The cached block standing for the last block of a sequence's key chain, with the generation
# of its content: what the next block's stored parent must equal.
CacheTail = tuple[int, int] | None
BROKEN: CacheTail = (-1, -1)  # the chain hit a block it cannot confirm: cache nothing after it


class BlockAllocator:
    """Hands out fixed-size KV blocks. Block ids are 0..num_blocks-1."""

    def __init__(self, num_blocks: int, *, block_size: int = 16, prefix_caching: bool = False,
                 extra_key: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.extra_key = extra_key
        # Pop from the end: low ids first, so small workloads touch a compact region.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # never cached
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced: oldest first
        self._ref = [0] * num_blocks
        self._num_used = 0  # blocks with a reference
        # Prefix cache, per block: key, token ids, (parent block, parent generation).
        self._by_key: dict[int, int] = {}
        self._key: list[int | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._parent: list[tuple[int, int] | None] = [None] * num_blocks
        self._gen = [0] * num_blocks  # bumped when a cached block is forgotten (its content goes)
        # Deferred frees: (step that must complete, block), in step order.
        self._deferred: deque[tuple[int, int]] = deque()
        self._deferred_at: dict[int, int] = {}
        self._last_launched = -1
        self._last_completed = -1
        # Counters (tokens): prompt tokens looked up, and those found cached.
        self.queries = 0
        self.hits = 0

    # ------------------------------------------------------------------------- counts
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (never cached, or cached and unreferenced)."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        """Blocks some request references."""
        return self._num_used

    @property
    def num_deferred(self) -> int:
        """Released blocks waiting for a launched step to complete."""
        return len(self._deferred_at)

    @property
    def num_cached(self) -> int:
        """Blocks holding a prefix-cache entry (referenced or not)."""
        return len(self._by_key)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    # ---------------------------------------------------------------------- allocate
    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} KV blocks, only {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:  # evict the least recently used cached block
                b, _ = self._lru.popitem(last=False)
                self._forget(b)
            self._ref[b] = 1
            out.append(b)
        self._num_used += n
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block. A block nobody references any more becomes
        free (or cached) once every step launched so far has completed. Cached blocks join
        the LRU order tail first: a sequence's last blocks are evicted before its first,
        which other prompts are likelier to share."""
        zero = []
        for b in blocks:
            if self._ref[b] <= 0:
                raise RuntimeError(f"KV block {b} freed twice or never allocated")
            self._ref[b] -= 1
            if not self._ref[b]:
                zero.append(b)
        self._num_used -= len(zero)
        if self._last_launched > self._last_completed:
            step = self._last_launched
            for b in reversed(zero):
                self._deferred.append((step, b))
                self._deferred_at[b] = step
            return
        for b in reversed(zero):
            if self._key[b] is not None:
                self._lru[b] = None
        self._free += [b for b in zero if self._key[b] is None]

    def _release(self, b: int) -> None:
        if self._key[b] is not None:
            self._lru[b] = None
        else:
            self._free.append(b)

    # ------------------------------------------------------------------ step guard
    def launched(self, step: int) -> None:
        """A step that may read or write every block referenced now has been launched."""
        self._last_launched = step

    def completed(self, step: int) -> None:
        """Every step up to `step` has completed: blocks it may have used can be reused."""
        self._last_completed = max(self._last_completed, step)
        dq, at = self._deferred, self._deferred_at
        while dq and dq[0][0] <= self._last_completed:
            s, b = dq.popleft()
            if at.get(b) == s:
                del at[b]
                self._release(b)

    def complete_all(self) -> None:
        """Nothing is in flight any more (the loop drained or recovered)."""
        self.completed(self._last_launched)

    # ---------------------------------------------------------------- prefix cache
    def match(self, token_ids: Sequence[int], max_blocks: int
              ) -> tuple[list[int], list[int], CacheTail]:
        """The cached blocks holding the longest prefix of `token_ids` (at most max_blocks
        full blocks), their keys and the chain's tail. Takes no reference: see `take`."""
        blocks: list[int] = []
        keys: list[int] = []
        parent: CacheTail = None
        if not self.prefix_caching:
            return blocks, keys, parent
        bs, key = self.block_size, None
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            key = hash((key, tokens, self.extra_key))
            b = self._by_key.get(key)
            if b is None or self._tokens[b] != tokens or self._parent[b] != parent:
                break
            blocks.append(b)
            keys.append(key)
            parent = (b, self._gen[b])
        return blocks, keys, parent

    def num_free_among(self, blocks: Sequence[int]) -> int:
        """How many of `blocks` (from `match`) are unreferenced and free: taking them uses up
        free blocks."""
        return sum(1 for b in blocks if b in self._lru)

    def take(self, blocks: Sequence[int]) -> None:
        """Add one reference to each cached block (a prefix hit)."""
        for b in blocks:
            if self._ref[b] == 0:
                self._num_used += 1
                if b in self._lru:
                    del self._lru[b]
                else:  # released while a step is in flight: it stays out of the free pools
                    self._deferred_at.pop(b, None)
            self._ref[b] += 1

    def record_lookup(self, queried: int, hit: int) -> None:
        self.queries += queried
        self.hits += hit

    def register(self, blocks: Sequence[int], keys: list[int], tail: CacheTail,
                 token_ids: Sequence[int], upto: int) -> CacheTail:
        """Give keys to a sequence's full blocks, from block len(keys) on while the block ends
        at or before `upto` (its KV computed, or being computed by a launched step, and its
        token ids known). `keys` is the sequence's key chain, extended in place; `tail` is
        the cached block (and its generation) that stands for the last block in the chain,
        None before the first; returns the new tail. Where another block already holds the
        same content (two requests computed one prefix at once), that block stands for it,
        so the chain goes on through the cached copy."""
        if not self.prefix_caching:
            return tail
        bs = self.block_size
        i = len(keys)
        while (i + 1) * bs <= upto:
            b = blocks[i]
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            key = hash((keys[-1] if keys else None, tokens, self.extra_key))
            keys.append(key)
            i += 1
            if tail == BROKEN:
                continue
            c = self._by_key.get(key)
            if c is None and self._key[b] is None:
                self._by_key[key] = b
                self._key[b] = key
                self._tokens[b] = tokens
                self._parent[b] = tail
                c = b
            elif c is None or self._tokens[c] != tokens or self._parent[c] != tail:
                tail = BROKEN  # a collision, or a block reused: nothing after it is cached
                continue
            tail = (c, self._gen[c])
        return tail

    def drop_cache(self) -> None:
        """Forget every cached prefix (after a failed step, whose KV cannot be trusted)."""
        for b in list(self._by_key.values()):
            self._forget(b)
        while self._lru:
            b, _ = self._lru.popitem(last=False)
            self._free.append(b)

    def _forget(self, b: int) -> None:
        key = self._key[b]
        if key is not None and self._by_key.get(key) == b:
            del self._by_key[key]
        self._key[b] = self._tokens[b] = self._parent[b] = None
        self._gen[b] += 1


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)
