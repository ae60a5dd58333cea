"""A slot's host block tables follow the request that holds each row, whoever held it before."""

from __future__ import annotations

import numpy as np

from engine.config import SamplingParams
from engine.core.batch import BufferLayout, HostView, assemble
from engine.core.block_allocator import BlockAllocator
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scratch import Scratch


def test_a_row_reused_by_a_new_request_with_the_same_id_gets_its_own_block_ids():
    sch = Scheduler(BlockAllocator(16), 4, 2, 64, 64)
    layout = BufferLayout(64, 2, 16)
    host = HostView(np.zeros(layout.size, np.int32), layout)
    scratch = Scratch(kv_slot=15 * 4)
    params = SamplingParams(max_tokens=4, detokenize=False)
    first = Request("x", list(range(1, 10)), params, 0, 0)
    sch.add(first)
    assemble(sch.schedule(), host, 4, scratch)
    row, old_blocks = first.row, list(first.block_ids)
    sch.finish(first, "abort")
    again = Request("x", list(range(1, 10)), params, 0, 0)  # an id is free again at once
    sch.add(again)
    assemble(sch.schedule(), host, 4, scratch)
    assert again.row == row and again.block_ids != old_blocks  # the case under test
    assert list(host.block_tables[row, : len(again.block_ids)]) == again.block_ids
