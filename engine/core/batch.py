"""Flat-batch assembly: one step's scheduler output written into a slot's host buffer.

Owns the buffer layout (one int32 buffer per slot, floats stored by bit pattern, so a step
needs a single host-to-device copy) and the pure function that fills it. No padding between
requests: per token a request index, position, cache slot and source of its token id; per
request a block-table row; per sampled request its sampling settings. Never touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput

# Per-token fields, then per-request block tables, then per-sample fields.
TOKEN_FIELDS = ("ids", "from_table", "token_row", "positions", "slot_mapping", "token_req")
SAMPLE_FIELDS = ("sample_idx", "sample_row", "sample_pos", "top_k", "seed", "temperature", "top_p")


@dataclass(slots=True, frozen=True)
class BufferLayout:
    max_tokens: int
    max_seqs: int
    max_blocks: int

    @property
    def size(self) -> int:
        return (
            len(TOKEN_FIELDS) * self.max_tokens
            + self.max_seqs * self.max_blocks
            + len(SAMPLE_FIELDS) * self.max_seqs
        )

    def offsets(self) -> dict[str, tuple[int, int]]:
        """field -> (start, length) in int32 elements."""
        out: dict[str, tuple[int, int]] = {}
        pos = 0
        for name in TOKEN_FIELDS:
            out[name] = (pos, self.max_tokens)
            pos += self.max_tokens
        out["block_tables"] = (pos, self.max_seqs * self.max_blocks)
        pos += self.max_seqs * self.max_blocks
        for name in SAMPLE_FIELDS:
            out[name] = (pos, self.max_seqs)
            pos += self.max_seqs
        return out


@dataclass(slots=True)
class StepMeta:
    """What the CPU knows about an assembled step."""

    num_tokens: int  # real tokens
    num_samples: int
    padded_tokens: int  # tokens added to reach the graph bucket
    greedy_only: bool
    samplers: list[Request] = field(default_factory=list)  # request of each sample row
    sample_positions: list[int] = field(default_factory=list)  # position of each new token


class HostView:
    """Numpy views of one slot's host buffer, one per field.

    Block tables are indexed by the request's token-table row and kept across steps: a row
    is rewritten only from the first block this slot has not seen yet (or whole, when the row
    changed hands or its request was preempted), so a decode step copies no block ids.
    """

    def __init__(self, buf: np.ndarray, layout: BufferLayout) -> None:
        assert buf.dtype == np.int32 and buf.size == layout.size
        self.layout = layout
        self.bt_owner: list[tuple[str, int] | None] = [None] * layout.max_seqs
        self.bt_len = [0] * layout.max_seqs
        offs = layout.offsets()
        for name, (start, n) in offs.items():
            view = buf[start : start + n]
            if name in ("temperature", "top_p"):
                view = view.view(np.float32)
            setattr(self, name, view)
        self.block_tables = self.block_tables.reshape(layout.max_seqs, layout.max_blocks)


def assemble(
    sched: SchedulerOutput,
    host: HostView,
    block_size: int,
    scratch_slot: int,
    scratch_row: int,
    pad_to: int | None = None,
) -> StepMeta:
    """Fill `host` with the step described by `sched`. Tokens past the real ones (up to
    pad_to) and unused sample rows point at the scratch cache slot and token-table row.
    token_req holds each token's token-table row, which indexes block_tables."""
    t = 0
    s = 0
    greedy_only = True
    samplers: list[Request] = []
    sample_positions: list[int] = []
    # Single-token chunks (decodes) are gathered and written in one numpy call per field.
    d_t: list[int] = []
    d_pos: list[int] = []
    d_slot: list[int] = []
    d_ids: list[int] = []
    d_table: list[int] = []
    d_row: list[int] = []
    s_idx: list[int] = []
    s_row: list[int] = []
    s_pos: list[int] = []
    s_temp: list[float] = []
    s_topk: list[int] = []
    s_topp: list[float] = []
    s_seed: list[int] = []
    for chunk in sched.chunks:
        req = chunk.request
        n = chunk.num_tokens
        start = chunk.start
        end = start + n
        blocks = req.block_ids
        row = req.row
        owner = (req.request_id, req.num_preemptions)
        if host.bt_owner[row] != owner:
            host.bt_owner[row] = owner
            host.bt_len[row] = 0
        written = host.bt_len[row]
        if written < len(blocks):
            host.block_tables[row, written : len(blocks)] = blocks[written:]
            host.bt_len[row] = len(blocks)
        if n == 1:
            d_t.append(t)
            d_pos.append(start)
            d_slot.append(blocks[start // block_size] * block_size + start % block_size)
            d_row.append(row)
            if start >= chunk.table_from:
                d_ids.append(0)
                d_table.append(1)
            else:
                d_ids.append(req.token_id_at(start))
                d_table.append(0)
        else:
            pos = np.arange(start, end, dtype=np.int32)
            host.positions[t : t + n] = pos
            barr = np.asarray(blocks, dtype=np.int32)
            host.slot_mapping[t : t + n] = barr[pos // block_size] * block_size + pos % block_size
            known = min(end, max(start, chunk.table_from))  # [start, known) from the host
            k = known - start
            if k:
                host.ids[t : t + k] = _known_ids(req, start, known)
                host.from_table[t : t + k] = 0
            if n - k:
                host.ids[t + k : t + n] = 0
                host.from_table[t + k : t + n] = 1
            host.token_row[t : t + n] = row
            host.token_req[t : t + n] = row
        t += n
        if chunk.samples:
            p = req.params
            s_idx.append(t - 1)
            s_row.append(row)
            s_pos.append(end)
            s_temp.append(p.temperature)
            s_topk.append(p.top_k if p.top_k > 0 else 0)
            s_topp.append(p.top_p)
            s_seed.append(req.seed & 0x7FFFFFFF)
            greedy_only &= p.temperature == 0
            samplers.append(req)
            sample_positions.append(end)
            s += 1
    if d_t:
        idx = np.asarray(d_t) if len(d_t) != t else slice(0, t)
        host.positions[idx] = d_pos
        host.slot_mapping[idx] = d_slot
        host.ids[idx] = d_ids
        host.from_table[idx] = d_table
        host.token_row[idx] = d_row
        host.token_req[idx] = d_row
    if s:
        host.sample_idx[:s] = s_idx
        host.sample_row[:s] = s_row
        host.sample_pos[:s] = s_pos
        host.temperature[:s] = s_temp
        host.top_k[:s] = s_topk
        host.top_p[:s] = s_topp
        host.seed[:s] = s_seed
    padded = 0
    if pad_to is not None and pad_to > t:
        padded = pad_to - t
        host.ids[t:pad_to] = 0
        host.from_table[t:pad_to] = 0
        host.token_row[t:pad_to] = scratch_row
        host.positions[t:pad_to] = 0
        host.slot_mapping[t:pad_to] = scratch_slot
        host.token_req[t:pad_to] = -1
    if pad_to is not None:
        # Graph replays sample every row: unused rows read token 0 and write the scratch row.
        host.sample_idx[s:] = 0
        host.sample_row[s:] = scratch_row
        host.sample_pos[s:] = 0
        host.temperature[s:] = 0.0
        host.top_k[s:] = 0
        host.top_p[s:] = 1.0
        host.seed[s:] = 0
    return StepMeta(t, s, padded, greedy_only, samplers, sample_positions)


def _known_ids(req: Request, start: int, end: int) -> list[int]:
    p = req.prompt_len
    if end <= p:
        return req.prompt_token_ids[start:end]
    if start >= p:
        return req.output_token_ids[start - p : end - p]
    return req.prompt_token_ids[start:] + req.output_token_ids[: end - p]
