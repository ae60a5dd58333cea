"""The persistent layer's grid barrier code path on a CPU (engine/model/persistent_barrier.py).

Under TRITON_INTERPRET=1 programs run one after another, so a barrier with more than one
program would wait forever; with ONE program every barrier's target is reached by its own
arrival, so the one-launch kernel with its barriers compiled in (the atomics, the volatile
polls, the flag) runs there. ``test_interp_*`` run in the interpreter child the parent starts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from test_fused_ops import IN_INTERPRETER, interp_only, run_interpreter_child

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_barrier_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert re.search(r"\b1 passed", proc.stdout) and "skipped" not in proc.stdout, report


@interp_only
def test_interp_one_launch_with_barriers_on_one_program_equals_phased() -> None:
    """fp32, a tiny layer on a 3-token decode: all five phases in one launch with the four
    barriers compiled in, on one program, give what one launch a phase gives (q, K/V, the
    hidden state); the counter ends at 4 arrivals (one a barrier) and its flag stays down."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from engine.attention.interface import AttnContext
    from engine.attention.reference import paged_attention
    from engine.model.llama import FusedDecoderLayer
    from engine.model.persistent_barrier import new_counter, timed_out
    from engine.model.persistent_layer import launch_layer, launch_parts
    from engine.model.persistent_step import _tiles

    g = torch.Generator().manual_seed(0)
    hidden, heads, kvh, d, inter, t, context = 64, 4, 2, 16, 96, 3, 20
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale  # noqa: E731
    layer = FusedDecoderLayer(
        input_norm=1 + rnd(hidden, scale=0.1), qkv=rnd((heads + 2 * kvh) * d, hidden,
                                                       scale=hidden ** -0.5),
        qkv_bias=None, qk_norm=None, o=rnd(hidden, heads * d, scale=(heads * d) ** -0.5),
        o_bias=None, post_norm=1 + rnd(hidden, scale=0.1),
        gate_up=rnd(2 * inter, hidden, scale=hidden ** -0.5), gate_up_bias=None,
        down=rnd(hidden, inter, scale=inter ** -0.5), down_bias=None, sliding_window=None,
        scaling=d ** -0.5)
    per_req = 2
    k0, v0 = rnd(t * per_req + 1, 16, kvh, d), rnd(t * per_req + 1, 16, kvh, d)
    bt = torch.arange(t * per_req, dtype=torch.int32).view(t, per_req)
    pos = torch.full((t,), context, dtype=torch.int32)
    cos_sin, x0 = rnd(context + 8, 2, d // 2), rnd(t, hidden)
    tiles = _tiles(t, x0.device, x0.dtype, hidden, inter, (heads + 2 * kvh) * d, heads, kvh, d,
                   4)

    def run(launches, counter):
        kv = (k0.clone(), v0.clone())
        ctx = AttnContext(kv_caches=[kv], slot_mapping=bt[:, 1].long() * 16 + context % 16,
                          block_tables=bt, token_req=torch.arange(t, dtype=torch.int32),
                          token_pos=pos, backend=paged_attention)
        x = x0.clone()
        parts = launch_parts(layer, x, ctx, kv, cos_sin, heads, tiles, None, 0)
        launch_layer(layer, x, pos, ctx, kv, cos_sin, 1e-5, counter, 0, parts,
                     launches=launches, programs=1, fence=0)
        return x, parts.buffers[0], kv

    counter = new_counter(x0.device)
    want = run([(p, p, False) for p in range(5)], counter)
    assert counter.tolist() == [0, 0], "the phased launches touched the counter"
    got = run([(0, 4, True)], counter)
    assert counter.tolist() == [4, 0] and not timed_out(counter)
    for a, b in zip((got[0], got[1], *got[2]), (want[0], want[1], *want[2]), strict=True):
        assert torch.equal(a, b)
