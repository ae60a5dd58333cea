"""Which forwards run the persistent decode layer (`fused_layer: persistent`, issue 22), and
the per-step state it needs.

Owns `PersistentStep`: attached to a FusedLlamaForCausalLM when the mode is selected, it says
whether a forward fits (`fits`: shapes only, so a CUDA graph captured for a token bucket stays
valid), picks the launch's tiles per token count (`tiles`), and runs every decoder layer with
`persistent_layer` (`run`), after zeroing the step's barrier counter (one memset, captured in
the graph with the rest).

What fits: Triton runs the model (CUDA, or the interpreter in tests); no tensor parallelism;
no per-head q/k norm (Qwen3), as for the rotary epilogue; a power-of-two head_dim >= 16 and
cache block; at most MAX_TOKENS tokens (decode-sized steps; the kernel is correct for any
flat batch, prefill chunks included, but one program per SM is the wrong shape for long
prefills). Anything else runs the `five` layer, per forward.

Never branches on tensor values, never syncs with the host.
"""

from __future__ import annotations

import functools
import os

import torch

from engine.attention.triton_config import DECODE_TOKENS, default_block_n
from engine.model import gemm_table
from engine.model.fused_ops import use_triton
from engine.model.fused_rope import rope_epilogue_fits
from engine.model.persistent_barrier import new_counter
from engine.model.persistent_layer import (
    BARRIERS_PER_LAYER,
    LayerTiles,
    max_programs,
    persistent_layer,
    phase_items,
)
from engine.model.persistent_model import LayerTable, persistent_model

MAX_TOKENS = 64  # the fused GEMMs' largest BLOCK_M (engine/model/fused_gemm.py `_blocks`)
# Experiment switch (issue 22, not a config key until measured): megabytes of the next GEMM's
# weights each phase asks L2 for (persistent_layer's PREFETCH); 0 or unset: off.
PREFETCH_ENV = "GAPLESS_PERSISTENT_PREFETCH_MB"
# Experiment switch: "1" runs every layer in ONE launch a step (engine/model/persistent_model.py)
# where the tensors allow it, with a grid barrier between layers instead of a kernel boundary.
WHOLE_MODEL_ENV = "GAPLESS_PERSISTENT_MODEL"
# Experiment switch: programs an SM (1 or 2). Two fit at once whatever the compile (4 warps:
# <= 255 registers a thread; the H200 tiles take <= 96 KB of shared memory): twice the loads in
# flight where a phase has more tiles than SMs (Llama-3.2-1B: 192-256).
PER_SM_ENV = "GAPLESS_PERSISTENT_PER_SM"

SUMMARY = ("persistent: one Triton launch a decoder layer (grid barriers between its phases) "
           f"for steps of at most {MAX_TOKENS} tokens; larger steps, tensor parallelism and "
           "models with a q/k norm run the five-kernel layer")


class PersistentStep:
    """The persistent path of one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        first = model.layers[0]
        self.hidden = first.qkv.shape[1]
        self.inter = first.gate_up.shape[0] // 2
        self.qkv_rows = first.qkv.shape[0]
        self.counter = new_counter(first.qkv.device)
        self.contiguous = all(p.is_contiguous() for p in model.layers.parameters())
        self.phased = False  # True: one launch a phase (the CUDA tests' oracle)
        self.prefetch_bytes = int(float(os.environ.get(PREFETCH_ENV) or 0) * 2 ** 20)
        self.whole_model = os.environ.get(WHOLE_MODEL_ENV, "0") == "1"
        self.per_sm = int(os.environ.get(PER_SM_ENV) or 1)
        if self.per_sm not in (1, 2):
            raise ValueError(f"{PER_SM_ENV} must be 1 or 2, got {self.per_sm}")
        self.table = LayerTable()

    def fits(self, x: torch.Tensor, gapless) -> bool:
        """Whether this forward (flat batch x [T, HID]) runs the persistent layer."""
        t = x.shape[0]
        if not (0 < t <= MAX_TOKENS and use_triton(x) and self.model.tp is None):
            return False
        k_cache, v_cache = gapless.kv_caches[0]
        d, block = k_cache.shape[3], k_cache.shape[1]
        return (x.dtype in (torch.float16, torch.bfloat16, torch.float32)
                and d >= 16 and d & (d - 1) == 0 and block & (block - 1) == 0
                and all(rope_epilogue_fits(layer.qk_norm, *kv, self.model.cos_sin)
                        for layer, kv in zip(self.model.layers, gapless.kv_caches, strict=True))
                and self.contiguous)

    def tiles(self, t: int, x: torch.Tensor, k_cache: torch.Tensor) -> LayerTiles:
        """The launch's tiles for t tokens: each GEMM phase takes the fused kernel's table
        entry for its shape (mode five, the heuristic where unmeasured), attention one split
        with choose_config's key tile; the grid is the largest phase, at most one per SM."""
        return _tiles(t, x.device, x.dtype, self.hidden, self.inter, self.qkv_rows,
                      self.model.num_heads, k_cache.shape[2], k_cache.shape[3],
                      k_cache.element_size(), self.per_sm)

    def run(self, x: torch.Tensor, positions: torch.Tensor, gapless) -> torch.Tensor:
        """Every decoder layer on the hidden state x (whole: no pending residual)."""
        x = x.contiguous()
        tiles = self.tiles(x.shape[0], x, gapless.kv_caches[0][0])
        self.counter[:1].zero_()  # the arrivals; [1], the timeout flag, stays
        m = self.model
        if (self.whole_model and not self.phased
                and persistent_model(m, self.table, x, positions, gapless, tiles, self.counter,
                                     self.prefetch_bytes)):
            return x
        n = len(m.layers)
        for i, layer in enumerate(m.layers):
            x = persistent_layer(layer, x, positions, gapless, gapless.kv_caches[i], m.cos_sin,
                                 m.num_heads, m.eps, tiles, self.counter,
                                 i * BARRIERS_PER_LAYER, phased=self.phased,
                                 next_qkv=m.layers[i + 1].qkv if i + 1 < n else None,
                                 prefetch_bytes=self.prefetch_bytes)
        return x


@functools.cache
def _tiles(t: int, device: torch.device, dtype: torch.dtype, hidden: int, inter: int,
           qkv_rows: int, heads: int, kv_heads: int, head_dim: int, elem: int,
           per_sm: int = 1) -> LayerTiles:
    from engine.model.fused_gemm import _blocks

    name = gemm_table.device_name(device.index or 0) if device.type == "cuda" else None

    def pick(kind: str, n: int, k: int) -> tuple[int, int]:
        cfg = gemm_table.choose("five", kind, n, k, t, name)
        # One program an SM (the table's kernels ran 2+): longer K tiles where K is long, so
        # each program keeps ~48 KB of weights in flight (3 of 4 stages) at 1B's shapes; the
        # sm_90 compile of that mix (qkv, o, down at 512, gate_up at 128) spills no register.
        long_k = k >= 2048 and kind != "norm_pair"
        return cfg.block_n, max(cfg.block_k, 512) if long_k else cfg.block_k

    # Attention runs one split a (query block, kv head): choose_config's one-split decode launch
    # (64-key tiles, block table a tile ahead) where its K/V rows allow, else its key tile.
    ahead = t <= DECODE_TOKENS and head_dim * elem <= 256
    att_block_n = 64 if ahead else default_block_n(head_dim, elem)
    tiles = LayerTiles(
        block_m=_blocks(t)[0], qkv=pick("norm_rope", qkv_rows, hidden),
        o=pick("residual", hidden, heads * head_dim), gate_up=pick("norm_pair", inter, hidden),
        down=pick("residual", hidden, inter), att_block_n=att_block_n, table_ahead=ahead,
        programs=1)
    items = phase_items(t, tiles, hidden=hidden, inter=inter, qkv_rows=qkv_rows,
                        kv_heads=kv_heads)
    return tiles._replace(programs=min(max_programs(device) * per_sm, max(items)))
