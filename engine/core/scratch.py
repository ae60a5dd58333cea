"""Where padding goes: the scratch KV-cache slot and the scratch token-table row.

Owns one small value type. The model runner allocates one KV block and one token-table row
beyond what the scheduler hands out and describes them with a `Scratch`; batch assembly (and
the step loop, for graph warm-up) only read it. Nothing else may know where scratch lives.
Pure Python: never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# A padding token's token-table row. The attention kernels read row -1 as "padding: attend to
# nothing, output zeros"; the token table has one row more than the scheduler hands out, so
# the same -1 used as a table index (negative indices wrap) lands on that extra, scratch row.
PAD_ROW = -1


@dataclass(slots=True, frozen=True)
class Scratch:
    """kv_slot: flat KV-cache index (block * block_size + offset) where padding tokens write
    their K/V; it lies in a block the allocator never hands out. table_row: the token-table
    row that padding tokens and unused sample rows read and write."""

    kv_slot: int
    table_row: int = PAD_ROW
