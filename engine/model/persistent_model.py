"""The persistent decode step, one launch for every decoder layer (issue 22, experiment behind
`GAPLESS_PERSISTENT_MODEL=1` on top of `fused_layer: persistent`).

Owns `_persistent_model_kernel` and `persistent_model`: the layer loop moves into the kernel, a
grid barrier replacing each kernel boundary between layers (SmolLM2: 30 launches a step become
one). The phases are `persistent_layer._layer_phases`, the same code as one launch a layer.

A layer's weights and caches are separate tensors, so the kernel reads them from a table: per
layer, the element offsets of its 13 tensors (norms, weights, biases, the next layer's qkv,
K and V caches) from one base tensor (the first layer's qkv weight), int64 [L, 13], each a
multiple of 8 elements (16 bytes in bf16: the compiler keeps its vector loads). The table is
built on the host once per set of tensors (weights and caches never move) and must exist before
a CUDA graph captures the step: `persistent_model` returns False (the caller then launches layer by
layer) when a capture would have to build it, or when the tensors do not fit the scheme
(different dtypes, an address not a multiple of 8 elements, layers with different biases or
windows).

Under the interpreter one program runs it without barriers (tests: it equals one launch a
layer); on CUDA the phased per-layer launch is its oracle. Never syncs with the host inside a
step.
"""

from __future__ import annotations

import torch

from engine.model.fused_ops import tl, triton
from engine.model.persistent_layer import FENCE_DEFAULT, PHASES, LayerTiles, launch_parts

COLUMNS = ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up",
           "gate_up_bias", "down", "down_bias", "next_qkv", "k_cache", "v_cache")

if triton is not None:
    from engine.model.persistent_barrier import grid_sync
    from engine.model.persistent_layer import _layer_phases

    @triton.jit
    def _at(base_ptr, row, j: tl.constexpr):
        """Column j of the layer's table row, as a pointer of base_ptr's type."""
        return base_ptr + tl.multiple_of(tl.load(row + j), 8)

    @triton.jit(do_not_specialize=["T"])
    def _persistent_model_kernel(
        tbl_ptr, L, base_ptr, x_ptr, q_ptr, attn_ptr, act_ptr,
        cs_ptr, rope_pos_ptr, slot_ptr, bt_ptr, req_ptr, tok_pos_ptr, bar_ptr, clk_ptr,
        pf_o, pf_gu, pf_dn, pf_qkv,
        T, HID, INTER, max_blocks, eps, scale_log2, window,
        stride_cs, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_btr,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, CACHE_BLOCK: tl.constexpr,
        G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, ATT_BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr, TABLE_AHEAD: tl.constexpr,
        QKV_BIAS: tl.constexpr, O_BIAS: tl.constexpr, GU_BIAS: tl.constexpr,
        DN_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, NORM_BK: tl.constexpr,
        QKV_BN: tl.constexpr, QKV_BK: tl.constexpr, QKV_IL: tl.constexpr,
        O_BN: tl.constexpr, O_BK: tl.constexpr, GU_BN: tl.constexpr, GU_BK: tl.constexpr,
        DN_BN: tl.constexpr, DN_BK: tl.constexpr, PREFETCH: tl.constexpr,
        NCOL: tl.constexpr, SYNC: tl.constexpr, CLOCK: tl.constexpr, FENCE: tl.constexpr,
    ):
        """Every layer's five phases, barriers between them and between layers (barrier
        l * PHASES + p + 1 after phase p of layer l). SYNC False: one program, no barrier
        (the interpreter's way to run it)."""
        pid = tl.program_id(0)
        progs = tl.num_programs(0)
        for layer in range(L):
            row = tbl_ptr + layer * NCOL
            _layer_phases(
                pid, progs, x_ptr, q_ptr, attn_ptr, act_ptr, _at(base_ptr, row, 0),
                _at(base_ptr, row, 1), _at(base_ptr, row, 2), _at(base_ptr, row, 3),
                _at(base_ptr, row, 4), _at(base_ptr, row, 5), _at(base_ptr, row, 6),
                _at(base_ptr, row, 7), _at(base_ptr, row, 8), _at(base_ptr, row, 9),
                cs_ptr, rope_pos_ptr, slot_ptr, _at(base_ptr, row, 11), _at(base_ptr, row, 12),
                bt_ptr, req_ptr, tok_pos_ptr, bar_ptr, clk_ptr + (layer * progs + pid) * 20,
                _at(base_ptr, row, 10),
                pf_o, pf_gu, pf_dn, pf_qkv, T, HID, INTER, max_blocks, layer * 5, eps,
                scale_log2, window, stride_cs, stride_kb, stride_ks, stride_kh, stride_vb,
                stride_vs, stride_vh, stride_btr, H, KVH, D, CACHE_BLOCK, G, G_PAD, BLOCK_Q,
                ATT_BN, HAS_WINDOW, IEEE_DOT, TABLE_AHEAD, QKV_BIAS, O_BIAS, GU_BIAS, DN_BIAS,
                BLOCK_M, NORM_BK, QKV_BN, QKV_BK, QKV_IL, O_BN, O_BK, GU_BN, GU_BK, DN_BN,
                DN_BK, 0, 4, SYNC, PREFETCH, CLOCK, FENCE)
            if SYNC:
                if layer + 1 < L:
                    grid_sync(bar_ptr, (layer * 5 + 5) * progs, FENCE)


class LayerTable:
    """The per-layer offset table of one model on one set of caches (module docstring)."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self.table: torch.Tensor | None = None

    def get(self, layers, kv_caches) -> torch.Tensor | None:
        """The table for these layers and caches, built if need be (never during a capture);
        None when they do not fit the scheme."""
        rows = [_row_tensors(layer, kv, layers[(i + 1) % len(layers)].qkv)
                for i, (layer, kv) in enumerate(zip(layers, kv_caches, strict=True))]
        key = tuple(0 if t is None else t.data_ptr() for row in rows for t in row)
        if key == self._key:
            return self.table
        base = layers[0].qkv
        capturing = base.is_cuda and torch.cuda.is_current_stream_capturing()
        if capturing or not _fits(layers, rows):
            return None
        elem = base.element_size()
        offsets = [[((base if t is None else t).data_ptr() - base.data_ptr()) // elem
                    for t in row] for row in rows]
        self.table = torch.tensor(offsets, dtype=torch.int64).to(base.device)
        self._key = key
        return self.table


def _row_tensors(layer, kv, next_qkv) -> list[torch.Tensor | None]:
    return [layer.input_norm, layer.qkv, layer.qkv_bias, layer.o, layer.o_bias,
            layer.post_norm, layer.gate_up, layer.gate_up_bias, layer.down, layer.down_bias,
            next_qkv, kv[0], kv[1]]


def _fits(layers, rows) -> bool:
    base = layers[0].qkv
    tensors = [t for row in rows for t in row if t is not None]
    same = {(lay.qkv_bias is None, lay.o_bias is None, lay.gate_up_bias is None,
             lay.down_bias is None, lay.sliding_window) for lay in layers}
    align = 8 * base.element_size()  # the kernel declares every offset a multiple of 8 elements
    return (len(same) == 1 and all(t.dtype == base.dtype and t.data_ptr() % align == 0
                                   and t.is_contiguous() for t in tensors))


def persistent_model(model, table: LayerTable, x: torch.Tensor, positions: torch.Tensor,
                     ctx, tiles: LayerTiles, counter: torch.Tensor, prefetch_bytes: int,
                     clock: torch.Tensor | None = None) -> bool:
    """Every decoder layer of `model` on x in ONE launch (x updated in place); False when the
    table cannot be had (the caller launches layer by layer). Off CUDA (the interpreter: its
    pointers are addresses too) one program runs it without barriers."""
    layers = list(model.layers)
    tbl = table.get(layers, ctx.kv_caches)
    if tbl is None:
        return False
    p = launch_parts(layers[0], x, ctx, ctx.kv_caches[0], model.cos_sin, model.num_heads,
                     tiles, layers[1].qkv if len(layers) > 1 else None, prefetch_bytes)
    _persistent_model_kernel[(tiles.programs if x.is_cuda else 1,)](
        tbl, len(layers), layers[0].qkv, x, *p.buffers, model.cos_sin, positions,
        ctx.slot_mapping, ctx.block_tables, ctx.token_req, ctx.token_pos, counter,
        counter if clock is None else clock, *p.prefetch, *p.sizes, model.eps, *p.attention,
        *p.strides,
        PREFETCH=prefetch_bytes > 0 and x.is_cuda, NCOL=len(COLUMNS), SYNC=x.is_cuda,
        CLOCK=clock is not None and x.is_cuda, FENCE=FENCE_DEFAULT if x.is_cuda else 0,
        **p.const)
    return True


assert PHASES == 5  # the kernel's barrier numbering (layer * 5 + phase + 1)
