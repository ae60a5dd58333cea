"""The persistent decode layer (issue 22, `fused_layer: persistent`): one Triton launch a
decoder layer on CUDA.

Owns `_persistent_layer_kernel`, its phases `_layer_phases` (shared with the whole-model kernel,
engine/model/persistent_model.py) and the launchers `persistent_layer` / `launch_layer`. The
kernel runs the five phases of the `five` layer over a persistent grid (at most one program per
SM; two with GAPLESS_PERSISTENT_PER_SM=2), each program striding over the phase's tiles, with a
grid-wide barrier (engine/model/persistent_barrier.py) between phases instead of a kernel
boundary:

    0  RMSNorm(x) @ qkv^T, rotary, q out, K/V into the paged cache   (fused_rope._qkv_rope_tile)
    1  paged attention, one split per (query block, kv head)  (triton_paged._attention_tile)
    2  x += attn @ o^T                       in place           (fused_gemm._linear_tile)
    3  act = SiLU(RMSNorm(x) @ gate^T) * (RMSNorm(x) @ up^T)    (fused_gemm._linear_tile)
    4  x += act @ down^T                     in place           (fused_gemm._linear_tile)

The tile code is the conventional path's, called as device functions, so a phase computes
exactly what that path's kernel computes for the same tile configuration. In place is safe:
in phases 2 and 4 a program reads the residual only at the tile it then writes.

`FIRST`/`LAST` (constexpr) choose the phases a launch runs and `SYNC` whether barriers are
compiled in: on CUDA one launch runs 0..4 with barriers; under TRITON_INTERPRET=1 (programs run
one after another, a barrier would deadlock) and with `phased=True` (the CUDA test's oracle)
each phase is its own launch. The hidden state is always whole between layers (no pending
residual add), as in `five`. Other constexprs: PREFETCH (each phase asks L2 for the next GEMM's
weights), CLOCK (time stamps for bench/suites/persistent_clock.py), FENCE (every thread fences
at each barrier; the default, see persistent_barrier.py).

Which steps use it, and the barrier counter: engine/model/persistent_step.py. Never syncs with
the host or branches on tensor values: grids and tiles depend on shapes only.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from engine.attention.triton_config import sm_count
from engine.model.fused_ops import tl, triton

PHASES = 5
BARRIERS_PER_LAYER = PHASES - 1
# Every thread fences at each grid barrier (persistent_barrier.grid_sync FENCE); "0" turns it
# off (issue 22: without it the H200 run at c9c481b went wrong; bench persistent-check tells).
FENCE_DEFAULT = int(os.environ.get("GAPLESS_PERSISTENT_FENCE") or 1)  # 0, 1 or 2 (grid_sync)
if FENCE_DEFAULT not in (0, 1, 2):
    raise ValueError(f"GAPLESS_PERSISTENT_FENCE must be 0, 1 or 2, got {FENCE_DEFAULT}")

if triton is not None:
    from engine.attention.triton_paged import _attention_tile
    from engine.model.fused_gemm import _linear_tile
    from engine.model.fused_rope import _qkv_rope_tile
    from engine.model.persistent_barrier import grid_sync, prefetch_l2

    @triton.jit
    def _stamp(clk_ptr, k: tl.constexpr, CLOCK: tl.constexpr):
        """CLOCK: the global timer (ns) and the SM's cycle counter at point k of the layer
        (bench/suites/persistent_clock.py reads them)."""
        if CLOCK:
            ns = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [clk_ptr],
                                           dtype=tl.int64, is_pure=False, pack=1)
            cycles = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,l", [clk_ptr],
                                               dtype=tl.int64, is_pure=False, pack=1)
            tl.store(clk_ptr + 2 * k, ns)
            tl.store(clk_ptr + 2 * k + 1, cycles)

    @triton.jit
    def _sync_after(phase: tl.constexpr, bar_ptr, bar_base, clk_ptr, FIRST: tl.constexpr,
                    LAST: tl.constexpr, SYNC: tl.constexpr, CLOCK: tl.constexpr,
                    FENCE: tl.constexpr):
        """The barrier between `phase` and the next, where this launch runs both (CLOCK:
        stamps 2 phase + 1 before it and 2 phase + 2 after it)."""
        if SYNC:
            if phase < LAST:
                if phase >= FIRST:
                    _stamp(clk_ptr, 2 * phase + 1, CLOCK)
                    grid_sync(bar_ptr, (bar_base + phase - FIRST + 1) * tl.num_programs(0),
                              FENCE)
                    _stamp(clk_ptr, 2 * phase + 2, CLOCK)

    @triton.jit(do_not_specialize=["T", "bar_base"])
    def _persistent_layer_kernel(
        x_ptr, q_ptr, attn_ptr, act_ptr,
        in_norm_ptr, qkv_ptr, qkv_b_ptr, o_ptr, o_b_ptr, post_norm_ptr, gu_ptr, gu_b_ptr,
        dn_ptr, dn_b_ptr,
        cs_ptr, rope_pos_ptr, slot_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, tok_pos_ptr, bar_ptr,
        clk_ptr, next_qkv_ptr, pf_o, pf_gu, pf_dn, pf_qkv,
        T, HID, INTER, max_blocks, bar_base, eps, scale_log2, window,
        stride_cs, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_btr,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, CACHE_BLOCK: tl.constexpr,
        G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, ATT_BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr, TABLE_AHEAD: tl.constexpr,
        QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr, GU_BIAS: tl.constexpr,
        DN_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, NORM_BK: tl.constexpr,
        QKV_BN: tl.constexpr, QKV_BK: tl.constexpr, QKV_IL: tl.constexpr,
        O_BN: tl.constexpr, O_BK: tl.constexpr, GU_BN: tl.constexpr, GU_BK: tl.constexpr,
        DN_BN: tl.constexpr, DN_BK: tl.constexpr,
        FIRST: tl.constexpr, LAST: tl.constexpr, SYNC: tl.constexpr, PREFETCH: tl.constexpr,
        CLOCK: tl.constexpr, FENCE: tl.constexpr,
    ):
        """One decoder layer, phases FIRST..LAST (`_layer_phases`), one program an SM."""
        _layer_phases(
            tl.program_id(0), tl.num_programs(0), x_ptr, q_ptr, attn_ptr, act_ptr, in_norm_ptr,
            qkv_ptr, qkv_b_ptr, o_ptr, o_b_ptr, post_norm_ptr, gu_ptr, gu_b_ptr, dn_ptr, dn_b_ptr,
            cs_ptr, rope_pos_ptr, slot_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, tok_pos_ptr, bar_ptr,
            clk_ptr + ((bar_base // 4) * tl.num_programs(0) + tl.program_id(0)) * 20,
            next_qkv_ptr, pf_o, pf_gu, pf_dn, pf_qkv, T, HID, INTER, max_blocks, bar_base, eps,
            scale_log2, window, stride_cs, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
            stride_vh, stride_btr, H, KVH, D, CACHE_BLOCK, G, G_PAD, BLOCK_Q, ATT_BN, HAS_WINDOW,
            IEEE_DOT, TABLE_AHEAD, QKV_BIAS, O_BIAS, GU_BIAS, DN_BIAS, BLOCK_M, NORM_BK, QKV_BN,
            QKV_BK, QKV_IL, O_BN, O_BK, GU_BN, GU_BK, DN_BN, DN_BK, FIRST, LAST, SYNC, PREFETCH,
            CLOCK, FENCE)

    @triton.jit
    def _layer_phases(
        pid, progs,
        x_ptr, q_ptr, attn_ptr, act_ptr,
        in_norm_ptr, qkv_ptr, qkv_b_ptr, o_ptr, o_b_ptr, post_norm_ptr, gu_ptr, gu_b_ptr,
        dn_ptr, dn_b_ptr,
        cs_ptr, rope_pos_ptr, slot_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, tok_pos_ptr, bar_ptr,
        clk_ptr, next_qkv_ptr, pf_o, pf_gu, pf_dn, pf_qkv,
        T, HID, INTER, max_blocks, bar_base, eps, scale_log2, window,
        stride_cs, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_btr,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, CACHE_BLOCK: tl.constexpr,
        G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, ATT_BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr, TABLE_AHEAD: tl.constexpr,
        QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr, GU_BIAS: tl.constexpr,
        DN_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, NORM_BK: tl.constexpr,
        QKV_BN: tl.constexpr, QKV_BK: tl.constexpr, QKV_IL: tl.constexpr,
        O_BN: tl.constexpr, O_BK: tl.constexpr, GU_BN: tl.constexpr, GU_BK: tl.constexpr,
        DN_BN: tl.constexpr, DN_BK: tl.constexpr,
        FIRST: tl.constexpr, LAST: tl.constexpr, SYNC: tl.constexpr, PREFETCH: tl.constexpr,
        CLOCK: tl.constexpr, FENCE: tl.constexpr,
    ):
        """Phases FIRST..LAST of one decoder layer (module docstring). Buffers contiguous:
        x [T, HID], q and attn [T, H, D], act [T, INTER]; weights row-major. QKV_BN counts
        half columns (the rotary kernel's BLOCK_N). bar_base: barriers of this step before
        this launch (the counter's target is (bar_base + i) * programs). PREFETCH: each phase
        first asks L2 for the next GEMM phase's weights (pf_* bytes of them; the down phase:
        the next layer's qkv at next_qkv_ptr), so they load from L2 after the barrier."""
        HALF: tl.constexpr = D // 2
        QD: tl.constexpr = H * D
        n_m = tl.cdiv(T, BLOCK_M)
        _stamp(clk_ptr, 0, CLOCK)
        if FIRST <= 0:
            if LAST >= 0:
                if PREFETCH:
                    prefetch_l2(o_ptr, pf_o, pid, progs, 512)
                n2 = (H + 2 * KVH) * HALF
                n_n = tl.cdiv(n2, QKV_BN)
                for w in range(pid, n_m * n_n, progs):
                    _qkv_rope_tile(
                        w // n_n, w % n_n, x_ptr, in_norm_ptr, qkv_ptr, qkv_b_ptr, x_ptr, x_ptr,
                        cs_ptr, rope_pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, T, n2, HID, H, KVH,
                        eps, HID, HID, HID, HID, stride_cs, QD, stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh, HALF, CACHE_BLOCK, True, False,
                        QKV_BIAS, BLOCK_M, QKV_BN, QKV_BK, NORM_BK, False, QKV_IL)
        _sync_after(0, bar_ptr, bar_base, clk_ptr, FIRST, LAST, SYNC, CLOCK, FENCE)
        if FIRST <= 1:
            if LAST >= 1:
                if PREFETCH:
                    prefetch_l2(gu_ptr, pf_gu, pid, progs, 512)
                for w in range(pid, T * KVH, progs):
                    _attention_tile(
                        w // KVH, w % KVH, 0, KVH, q_ptr, k_ptr, v_ptr, bt_ptr, req_ptr,
                        tok_pos_ptr, attn_ptr, attn_ptr, attn_ptr, req_ptr, T, max_blocks, 1, 1,
                        QD, D, 1, stride_kb, stride_ks, stride_kh, 1, stride_vb, stride_vs,
                        stride_vh, 1, stride_btr, 1, QD, D, 1, scale_log2, window, H, G, G_PAD,
                        BLOCK_Q, D, CACHE_BLOCK, ATT_BN, HAS_WINDOW, IEEE_DOT, False,
                        TABLE_AHEAD, False)
        _sync_after(1, bar_ptr, bar_base, clk_ptr, FIRST, LAST, SYNC, CLOCK, FENCE)
        if FIRST <= 2:
            if LAST >= 2:
                if PREFETCH:
                    prefetch_l2(dn_ptr, pf_dn, pid, progs, 512)
                n_n = tl.cdiv(HID, O_BN)
                for w in range(pid, n_m * n_n, progs):
                    _linear_tile(
                        w // n_n, w % n_n, attn_ptr, attn_ptr, o_ptr, o_b_ptr, x_ptr, x_ptr,
                        attn_ptr, attn_ptr, T, HID, QD, eps, QD, QD, HID, HID, QD, QD,
                        False, False, True, False, O_BIAS, BLOCK_M, O_BN, O_BK, NORM_BK, False)
        _sync_after(2, bar_ptr, bar_base, clk_ptr, FIRST, LAST, SYNC, CLOCK, FENCE)
        if FIRST <= 3:
            if LAST >= 3:
                n_n = tl.cdiv(INTER, GU_BN)
                for w in range(pid, n_m * n_n, progs):
                    _linear_tile(
                        w // n_n, w % n_n, x_ptr, post_norm_ptr, gu_ptr, gu_b_ptr, act_ptr,
                        act_ptr, x_ptr, x_ptr, T, INTER, HID, eps, HID, HID, INTER, INTER, HID,
                        HID, True, True, False, False, GU_BIAS, BLOCK_M, GU_BN, GU_BK, NORM_BK,
                        False)
        _sync_after(3, bar_ptr, bar_base, clk_ptr, FIRST, LAST, SYNC, CLOCK, FENCE)
        if FIRST <= 4:
            if LAST >= 4:
                if PREFETCH:
                    prefetch_l2(next_qkv_ptr, pf_qkv, pid, progs, 512)
                n_n = tl.cdiv(HID, DN_BN)
                for w in range(pid, n_m * n_n, progs):
                    _linear_tile(
                        w // n_n, w % n_n, act_ptr, act_ptr, dn_ptr, dn_b_ptr, x_ptr, x_ptr,
                        act_ptr, act_ptr, T, HID, INTER, eps, INTER, INTER, HID, HID, INTER,
                        INTER, False, False, True, False, DN_BIAS, BLOCK_M, DN_BN, DN_BK,
                        NORM_BK, False)
        _stamp(clk_ptr, 9, CLOCK)


class LayerTiles(NamedTuple):
    """Tile configuration of one launch (shapes only): (block_n, block_k) per GEMM phase, the
    attention's key tile, and the grid."""

    block_m: int
    qkv: tuple[int, int]  # block_n in output columns (two per rotary pair), block_k
    o: tuple[int, int]
    gate_up: tuple[int, int]
    down: tuple[int, int]
    att_block_n: int
    table_ahead: bool
    programs: int
    num_warps: int = 4
    num_stages: int = 4  # 53 KB (SmolLM2) to 96 KB (1B) of shared memory at sm_90


def phase_items(t: int, tiles: LayerTiles, *, hidden: int, inter: int, qkv_rows: int,
                kv_heads: int) -> list[int]:
    """The number of tiles (work items) of each phase for a batch of t tokens."""
    n_m = -(-t // tiles.block_m)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    return [n_m * cdiv(qkv_rows // 2, tiles.qkv[0] // 2), t * kv_heads,
            n_m * cdiv(hidden, tiles.o[0]), n_m * cdiv(inter, tiles.gate_up[0]),
            n_m * cdiv(hidden, tiles.down[0])]


def max_programs(device: torch.device) -> int:
    """The persistent grid's ceiling: one program per SM on CUDA; on the CPU (interpreter)
    a few, so that the tests exercise programs striding over several tiles."""
    return sm_count(device) if device.type == "cuda" else 3


class LaunchParts(NamedTuple):
    """What a launch of the layer (or of the whole model, engine/model/persistent_model.py)
    passes besides the layer's weights and caches, in the kernels' argument order."""

    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q, attn [T, H, D]; act [T, I]
    prefetch: tuple[int, int, int, int]  # bytes asked of L2: o, gate_up, down, next qkv
    sizes: tuple[int, int, int, int]  # T, HID, INTER, max_blocks
    attention: tuple[float, int]  # scale * log2(e), window (0: none)
    strides: tuple[int, ...]  # cos/sin row, K cache block/slot/head, V the same, block table
    const: dict


def launch_parts(layer, x: torch.Tensor, ctx, kv: tuple[torch.Tensor, torch.Tensor],
                 cos_sin: torch.Tensor, num_heads: int, tiles: LayerTiles,
                 next_qkv: torch.Tensor | None, prefetch_bytes: int) -> LaunchParts:
    """The buffers, scalars and constexprs of a launch over x [T, HID] (layer: a
    FusedDecoderLayer; its shapes, biases and window are every layer's)."""
    k_cache, v_cache = kv
    t, hid = x.shape
    d, kvh, cache_block = k_cache.shape[3], k_cache.shape[2], k_cache.shape[1]
    inter = layer.gate_up.shape[0] // 2
    q = torch.empty((t, num_heads, d), dtype=x.dtype, device=x.device)
    act = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    g_pad = triton.next_power_of_2(num_heads // kvh)
    window = layer.sliding_window
    nxt = layer.qkv if next_qkv is None else next_qkv
    const = dict(
        H=num_heads, KVH=kvh, D=d, CACHE_BLOCK=cache_block, G=num_heads // kvh, G_PAD=g_pad,
        BLOCK_Q=max(1, 16 // g_pad), ATT_BN=tiles.att_block_n, HAS_WINDOW=window is not None,
        IEEE_DOT=x.dtype == torch.float32, TABLE_AHEAD=tiles.table_ahead,
        QKV_BIAS=layer.qkv_bias is not None, O_BIAS=layer.o_bias is not None,
        GU_BIAS=layer.gate_up_bias is not None, DN_BIAS=layer.down_bias is not None,
        BLOCK_M=tiles.block_m, NORM_BK=min(8192 // tiles.block_m, triton.next_power_of_2(hid)),
        QKV_BN=tiles.qkv[0] // 2, QKV_BK=tiles.qkv[1], QKV_IL=tiles.qkv[0] == 16,
        O_BN=tiles.o[0], O_BK=tiles.o[1], GU_BN=tiles.gate_up[0], GU_BK=tiles.gate_up[1],
        DN_BN=tiles.down[0], DN_BK=tiles.down[1],
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return LaunchParts(
        buffers=(q, torch.empty_like(q), act),
        prefetch=tuple(min(prefetch_bytes, _bytes(w))
                       for w in (layer.o, layer.gate_up, layer.down, nxt)),
        sizes=(t, hid, inter, ctx.block_tables.shape[1]),
        attention=(layer.scaling * 1.4426950408889634, window or 0),
        strides=(cos_sin.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                 v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                 ctx.block_tables.stride(0)),
        const=const,
    )


def persistent_layer(
    layer, x: torch.Tensor, positions: torch.Tensor, ctx, kv: tuple[torch.Tensor, torch.Tensor],
    cos_sin: torch.Tensor, num_heads: int, eps: float, tiles: LayerTiles,
    counter: torch.Tensor, bar_base: int, *, phased: bool = False,
    next_qkv: torch.Tensor | None = None, prefetch_bytes: int = 0,
    clock: torch.Tensor | None = None, fence: int | None = None,
) -> torch.Tensor:
    """One decoder layer over the whole hidden state x [T, HID] (updated in place and
    returned); `layer` a FusedDecoderLayer. One launch on CUDA (unless `phased`), one a phase
    under the interpreter. bar_base: the barriers this step has passed on `counter`.
    prefetch_bytes > 0 (one launch only): each phase asks L2 for up to that many bytes of the
    next GEMM's weights (the down phase: of next_qkv, the next layer's). clock (one launch
    only): int64 [layers, programs, 10, 2] receiving each program's time stamps (see
    bench/suites/persistent_clock.py)."""
    parts = launch_parts(layer, x, ctx, kv, cos_sin, num_heads, tiles, next_qkv,
                         prefetch_bytes)
    one_launch = x.is_cuda and not phased
    plan = [(0, PHASES - 1, True)] if one_launch else [(p, p, False) for p in range(PHASES)]
    launch_layer(layer, x, positions, ctx, kv, cos_sin, eps, counter, bar_base, parts,
                 launches=plan, programs=tiles.programs, next_qkv=next_qkv,
                 prefetch=one_launch and prefetch_bytes > 0, clock=clock if one_launch else None,
                 fence=fence)
    return x


def launch_layer(layer, x, positions, ctx, kv, cos_sin, eps: float, counter: torch.Tensor,
                 bar_base: int, parts: LaunchParts, *, launches: list[tuple[int, int, bool]],
                 programs: int, next_qkv: torch.Tensor | None = None, prefetch: bool = False,
                 clock: torch.Tensor | None = None, fence: int | None = None) -> None:
    """The kernel launches of one layer: for each (first, last, sync) of `launches`, phases
    first..last on `programs` programs, grid barriers compiled in where sync (the buffers are
    `parts.buffers`, so a caller can read q, attn and act afterwards). fence: grid_sync's FENCE
    (0 none, 1 every thread on both sides, 2 after the wait only; None: the
    GAPLESS_PERSISTENT_FENCE switch, default 1)."""
    w = layer.qkv
    args = (
        x, *parts.buffers, layer.input_norm, w, _or(layer.qkv_bias, w), layer.o,
        _or(layer.o_bias, w), layer.post_norm, layer.gate_up, _or(layer.gate_up_bias, w),
        layer.down, _or(layer.down_bias, w), cos_sin, positions, ctx.slot_mapping, *kv,
        ctx.block_tables, ctx.token_req, ctx.token_pos, counter,
        counter if clock is None else clock, w if next_qkv is None else next_qkv,
        *parts.prefetch, *parts.sizes, bar_base, eps, *parts.attention, *parts.strides,
    )
    for first, last, sync in launches:
        _persistent_layer_kernel[(programs,)](
            *args, FIRST=first, LAST=last, SYNC=sync, PREFETCH=sync and prefetch,
            CLOCK=sync and clock is not None,
            FENCE=int(FENCE_DEFAULT if fence is None else fence) if sync else 0,
            **parts.const)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _or(t: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    """An absent bias: any pointer (the kernel never reads it)."""
    return dummy if t is None else t
