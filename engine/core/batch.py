"""Flat-batch assembly: one step's scheduler output written into a slot's host buffer.

Owns the buffer layout (one int32 buffer per slot, floats stored by bit pattern, so a step
needs a single host-to-device copy) and the pure function that fills it. No padding between
requests: per token a request index, position, cache slot and source of its token id; per
request a block-table row; per sampled request its sampling settings. Never touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.core.request import Request
from engine.core.scheduler import ScheduledChunk, SchedulerOutput
from engine.core.scratch import Scratch

# Per-token fields, then per-request block tables, then per-sample fields. Every field is
# int32 except FLOAT_FIELDS, which hold float32 bit patterns in the same int32 buffer (one
# host-to-device copy per step); host and device views both reinterpret them through
# `BufferLayout.views`.
TOKEN_FIELDS = ("ids", "from_table", "positions", "slot_mapping", "token_req")
SAMPLE_FIELDS = ("sample_idx", "sample_row", "sample_pos", "top_k", "seed", "temperature", "top_p")
FLOAT_FIELDS = frozenset({"temperature", "top_p"})
# top_k and seed travel as int32: the boundary (SamplingParams.validate) keeps them in range.
INT32_MAX = 2**31 - 1


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

    def views(self, buf: Any, float_dtype: Any) -> dict[str, Any]:
        """One view per field of a flat int32 buffer (a numpy array or a torch tensor):
        FLOAT_FIELDS reinterpreted as `float_dtype`, block_tables as [max_seqs, max_blocks].
        The single place that knows how the buffer is laid out, for host and device alike."""
        out = {}
        for name, (start, n) in self.offsets().items():
            v = buf[start : start + n]
            out[name] = v.view(float_dtype) if name in FLOAT_FIELDS else v
        out["block_tables"] = out["block_tables"].reshape(self.max_seqs, self.max_blocks)
        return out


@dataclass(slots=True)
class StepMeta:
    """What the CPU knows about an assembled step."""

    num_tokens: int  # real tokens
    num_samples: int
    padded_tokens: int  # tokens added to reach the graph bucket
    greedy_only: bool
    samplers: list[Request] = field(default_factory=list)  # request of each sample row


class HostView:
    """Numpy views of one slot's host buffer, one per field.

    Block tables are indexed by the request's token-table row and kept across steps: a row
    is rewritten only from the first block this slot has not seen yet (or whole, when the row
    changed hands or its request was preempted), so a decode step copies no block ids.
    """

    ids: np.ndarray
    from_table: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    token_req: np.ndarray
    block_tables: np.ndarray
    sample_idx: np.ndarray
    sample_row: np.ndarray
    sample_pos: np.ndarray
    top_k: np.ndarray
    seed: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray

    def __init__(self, buf: np.ndarray, layout: BufferLayout) -> None:
        assert buf.dtype == np.int32 and buf.size == layout.size
        self.layout = layout
        # Per row: the request (object and preemption count) whose block ids it holds, and
        # how many of them. Checked for every request at every step, so by identity.
        self.bt_req: list[Request | None] = [None] * layout.max_seqs
        self.bt_pre = [0] * layout.max_seqs
        self.bt_len = [0] * layout.max_seqs
        for name, view in layout.views(buf, np.float32).items():
            setattr(self, name, view)

    def sync_block_table(self, req: Request) -> None:
        """Write the block ids of req's row that this slot has not seen yet."""
        row, blocks = req.row, req.block_ids
        if self.bt_req[row] is not req or self.bt_pre[row] != req.num_preemptions:
            self.bt_req[row], self.bt_pre[row] = req, req.num_preemptions
            self.bt_len[row] = 0
        written = self.bt_len[row]
        if written < len(blocks):
            self.block_tables[row, written : len(blocks)] = blocks[written:]
            self.bt_len[row] = len(blocks)


def assemble(
    sched: SchedulerOutput,
    host: HostView,
    block_size: int,
    scratch: Scratch,
    pad_to: int | None = None,
) -> StepMeta:
    """Fill `host` with the step described by `sched`. Tokens past the real ones (up to
    pad_to) and, when padding, unused sample rows point at scratch. token_req holds each
    token's token-table row, which also indexes block_tables (PAD_ROW for padding)."""
    # Single-token chunks (decodes) and sampled rows are gathered as one tuple each, then
    # written with one numpy call per field: per-element numpy writes would cost more.
    decodes: list[tuple[int, int, int, int, int, int]] = []  # t, pos, slot, row, id, from_table
    samples: list[tuple[int, int, int, int, int, float, float]] = []  # t, row, pos, + params
    samplers: list[Request] = []
    greedy_only = True
    t = 0
    for chunk in sched.chunks:
        req = chunk.request
        row = req.row
        if host.bt_req[row] is not req or host.bt_len[row] != len(req.block_ids) or \
                host.bt_pre[row] != req.num_preemptions:
            host.sync_block_table(req)  # most decode steps skip this call
        start, n = chunk.start, chunk.num_tokens
        if n == 1:
            slot = req.block_ids[start // block_size] * block_size + start % block_size
            if start >= chunk.table_from:
                decodes.append((t, start, slot, row, 0, 1))
            else:
                decodes.append((t, start, slot, row, req.token_id_at(start), 0))
        else:
            _write_chunk(host, chunk, t, block_size)
        t += n
        if chunk.samples:
            p = req.params
            samples.append((t - 1, row, start + n, p.top_k if p.top_k > 0 else 0,
                            req.seed & INT32_MAX, p.temperature, p.top_p))
            samplers.append(req)
            greedy_only &= p.temperature == 0
    if decodes:
        at, positions, slots, rows, ids, from_table = zip(*decodes, strict=True)
        idx = slice(0, t) if len(decodes) == t else list(at)
        host.positions[idx] = positions
        host.slot_mapping[idx] = slots
        host.token_req[idx] = rows
        host.ids[idx] = ids
        host.from_table[idx] = from_table
    s = len(samples)
    if s:
        at, rows, positions, top_k, seed, temperature, top_p = zip(*samples, strict=True)
        host.sample_idx[:s] = at
        host.sample_row[:s] = rows
        host.sample_pos[:s] = positions
        host.top_k[:s] = top_k
        host.seed[:s] = seed
        host.temperature[:s] = temperature
        host.top_p[:s] = top_p
    padded = 0
    if pad_to is not None:
        padded = max(0, pad_to - t)
        _write_padding(host, t, pad_to, s, scratch)
    return StepMeta(t, s, padded, greedy_only, samplers)


def _write_chunk(host: HostView, chunk: ScheduledChunk, t: int, block_size: int) -> None:
    """A multi-token chunk (prefill, or recompute after preemption), vectorised."""
    req, n, start = chunk.request, chunk.num_tokens, chunk.start
    end = start + n
    pos = np.arange(start, end, dtype=np.int32)
    host.positions[t : t + n] = pos
    barr = np.asarray(req.block_ids, dtype=np.int32)
    host.slot_mapping[t : t + n] = barr[pos // block_size] * block_size + pos % block_size
    known = min(end, max(start, chunk.table_from))  # [start, known) from the host
    k = known - start
    if k:
        host.ids[t : t + k] = _known_ids(req, start, known)
        host.from_table[t : t + k] = 0
    if n - k:
        host.ids[t + k : t + n] = 0
        host.from_table[t + k : t + n] = 1
    host.token_req[t : t + n] = req.row


def _write_padding(host: HostView, t: int, pad_to: int, s: int, scratch: Scratch) -> None:
    """A CUDA graph runs a fixed token count and samples every row: padding tokens attend to
    nothing and write their K/V to scratch; unused sample rows read token 0 and write their
    token into the scratch row."""
    if pad_to > t:
        host.ids[t:pad_to] = 0
        host.from_table[t:pad_to] = 0
        host.positions[t:pad_to] = 0
        host.slot_mapping[t:pad_to] = scratch.kv_slot
        host.token_req[t:pad_to] = scratch.table_row
    host.sample_idx[s:] = 0
    host.sample_row[s:] = scratch.table_row
    host.sample_pos[s:] = 0
    host.temperature[s:] = 0.0
    host.top_k[s:] = 0
    host.top_p[s:] = 1.0
    host.seed[s:] = 0


def _known_ids(req: Request, start: int, end: int) -> list[int]:
    p = req.prompt_len
    if end <= p:
        return req.prompt_token_ids[start:end]
    if start >= p:
        return req.output_token_ids[start - p : end - p]
    return req.prompt_token_ids[start:] + req.output_token_ids[: end - p]
