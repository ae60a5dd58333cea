"""Our forward for the Llama family (Llama, Mistral, Qwen2, Qwen3): a few kernels per layer.

Owns `FusedLlamaForCausalLM`, an nn.Module with the call signature and output of a
transformers causal LM as the runner uses it (`input_ids`, `position_ids`, `logits_to_keep`,
`gapless=AttnContext`, returns an object with `.logits [1, S, V]`), so the runner, scoring and
CUDA-graph capture work unchanged. Per layer, on CUDA:

    add_rms_norm (residual add + RMSNorm)   1 Triton kernel
    qkv GEMM (+ bias)                        1 cuBLAS
    rope_and_cache (q/k norm, rotary, K/V cache write, q out)   1 Triton kernel
    paged attention                          1-2 Triton kernels (split-K reduce)
    o GEMM                                   1 cuBLAS
    add_rms_norm                             1 Triton kernel
    gate_up GEMM                             1 cuBLAS
    silu_and_mul                             1 Triton kernel
    down GEMM                                1 cuBLAS

then the final norm and the LM head for the sampled rows only. That is config key
`decode_layer: cublas`; `FusedPath` says what `fused` and `auto` run instead (the GEMMs with
the norm in their prologue and SiLU*up, the residual add or rotary + the KV write in their
epilogue). Weights are built (fused) from a loaded transformers model by
`engine.model.weights.build_fused_model`.

Tensor parallelism: `engine.parallel.shard.shard_fused_model` cuts the weights into one rank's
share and sets `tp` (an `engine.parallel.comm.TPComm`) on the model and its layers; the forward
then all-reduces after the o and down GEMMs and runs the embedding and the LM head
vocabulary-parallel. With `tp` None (one rank) nothing changes.

Never syncs with the host or branches on tensor values (CUDA-graph capture), and never holds
a second copy of the checkpoint's weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.interface import AttnContext
from engine.config import DECODE_LAYERS
from engine.model import gemm_table
from engine.model.fused_gemm import fused_add_norm_linear, fused_linear
from engine.model.fused_ops import add_rms_norm, rope_and_cache, silu_and_mul
from engine.model.fused_rope import fused_qkv_rope, rope_epilogue_fits
from engine.model.gemm_table import GemmConfig


@dataclass(frozen=True, slots=True)
class FusedPath:
    """Which decode layer runs (config keys decode_layer, fused_rotary, fused_pdl, pdl_overlap,
    gemm_table).

    layer "cublas": add+norm, qkv, rope+cache, attention, o, add+norm, gate_up, SiLU*up, down,
    the GEMMs on cuBLAS. "fused": the deepest fusion that fits, the fused Triton kernel for
    every GEMM: the qkv GEMM with its norm prologue and, with `rotary`, rotary + the KV write in
    its epilogue (models with a q/k norm keep the separate rope+cache kernel), attention, o +
    residual, gate_up with its norm prologue and SiLU*up, down + residual. "auto": per GEMM
    shape whichever engine/model/gemm_table.py measured faster, the fused kernel or cuBLAS and
    the separate ops. `rotary` False keeps the separate rope+cache kernel everywhere: in bf16
    the epilogue's q and k differ from the separate kernel's in the last bits (another
    summation and rounding order), enough to flip near-tied greedy tokens. `pdl`: the fused
    kernels and the Triton attention launch with programmatic dependent launch (Hopper+),
    overlapping their neighbours as `overlap` says (engine/model/pdl_launch.py). `table`: the
    per-shape table "auto" reads (None: the shipped one).
    """

    layer: str = "cublas"
    rotary: bool = True
    pdl: bool = False
    overlap: str = "prefetch"
    table: str | None = None

    def __post_init__(self) -> None:
        if self.layer not in DECODE_LAYERS:
            raise ValueError(f"decode_layer must be one of {', '.join(DECODE_LAYERS)}, "
                             f"got {self.layer!r}")

    @classmethod
    def from_config(cls, config: Any) -> FusedPath:
        """The path an EngineConfig selects."""
        return cls(config.decode_layer, config.fused_rotary, config.fused_pdl,
                   config.pdl_overlap, config.gemm_table)

    @property
    def launch(self) -> dict:
        """The launch keywords of the fused kernels."""
        return {"pdl": self.pdl, "overlap": self.overlap}

    @property
    def attention_launch(self) -> dict:
        """The launch keywords of the attention backend (none without PDL: every backend
        takes the plain call)."""
        return {"pdl": True, "kv_prefetch": self.overlap == "prefetch"} if self.pdl else {}

    def pick(self, kind: str, n: int, k: int, x: torch.Tensor) -> GemmConfig | None:
        """The fused kernel's configuration for this GEMM, or None for cuBLAS + separate ops."""
        if kind == "norm_rope" and not self.rotary:
            return None
        name = gemm_table.device_name(x.device.index or 0) if x.is_cuda else None
        return gemm_table.choose(self.layer, kind, n, k, x.shape[0], name, self.pdl, self.table)


@dataclass(slots=True)
class CausalLMOutput:
    """What the runner reads off a forward: logits [1, S, V]."""

    logits: torch.Tensor


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


class FusedDecoderLayer(nn.Module):
    """One decoder layer's fused weights and its forward over a flat batch."""

    def __init__(
        self,
        *,
        input_norm: torch.Tensor,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        qk_norm: torch.Tensor | None,
        o: torch.Tensor,
        o_bias: torch.Tensor | None,
        post_norm: torch.Tensor,
        gate_up: torch.Tensor,
        gate_up_bias: torch.Tensor | None,
        down: torch.Tensor,
        down_bias: torch.Tensor | None,
        sliding_window: int | None,
        scaling: float,
    ) -> None:
        super().__init__()
        self.input_norm = _param(input_norm)
        self.qkv = _param(qkv)
        self.qkv_bias = _param(qkv_bias)
        self.qk_norm = _param(qk_norm)
        self.o = _param(o)
        self.o_bias = _param(o_bias)
        self.post_norm = _param(post_norm)
        self.gate_up = _param(gate_up)
        self.gate_up_bias = _param(gate_up_bias)
        self.down = _param(down)
        self.down_bias = _param(down_bias)
        self.sliding_window = sliding_window
        self.scaling = scaling
        self.tp: Any = None  # engine.parallel.comm.TPComm on a tensor-parallel rank
        self.path = FusedPath()  # set by FusedLlamaForCausalLM.set_fused_path

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        ctx: AttnContext,
        kv: tuple[torch.Tensor, torch.Tensor],
        cos_sin: torch.Tensor,
        num_heads: int,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.shape[0]
        if self.path.layer != "cublas" and self.tp is None:
            return self._forward_fused(x, residual, positions, ctx, kv, cos_sin, num_heads, eps)
        h, residual = add_rms_norm(x, residual, self.input_norm, eps)
        qkv = F.linear(h, self.qkv, self.qkv_bias)
        attn = self._attend(qkv, positions, ctx, kv, cos_sin, num_heads, eps)
        x = F.linear(attn.view(t, -1), self.o, self.o_bias)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        h, residual = add_rms_norm(x, residual, self.post_norm, eps)
        a = silu_and_mul(F.linear(h, self.gate_up, self.gate_up_bias))
        x = F.linear(a, self.down, self.down_bias)
        if self.tp is not None:
            x = self.tp.all_reduce(x)
        return x, residual

    def _attend(self, qkv, positions, ctx, kv, cos_sin, num_heads, eps):
        """Rotary (and q/k norm) with the new keys and values written to the cache, then
        attention: the same two kernels on every decode-layer path but the qkv GEMM with the
        rotary epilogue (`_forward_fused`)."""
        k_cache, v_cache = kv
        q = rope_and_cache(qkv, cos_sin, positions, ctx.slot_mapping, k_cache, v_cache,
                           num_heads, self.qk_norm, eps)
        return self._attention(q, ctx, kv)

    def _attention(self, q, ctx, kv):
        k_cache, v_cache = kv
        return ctx.backend(q, k_cache, v_cache, ctx.block_tables, ctx.token_req, ctx.token_pos,
                           scale=self.scaling, sliding_window=self.sliding_window,
                           **self.path.attention_launch)

    def _qkv_rope(self, x, residual, positions, ctx, kv, cos_sin, num_heads, eps):
        """The qkv GEMM with its norm prologue and rotary + the KV write in its epilogue (one
        kernel), where the path picks it for this shape and the model fits it (no q/k norm):
        (q, the hidden state x + residual); None where it does not apply."""
        k_cache, v_cache = kv
        if not rope_epilogue_fits(self.qk_norm, k_cache, v_cache, cos_sin):
            return None
        cfg = self.path.pick("norm_rope", self.qkv.shape[0], self.qkv.shape[1], x)
        if cfg is None:
            return None
        q, x_sum = fused_qkv_rope(
            x, residual, self.qkv, self.qkv_bias, norm=self.input_norm, eps=eps,
            cos_sin=cos_sin, positions=positions, slot_mapping=ctx.slot_mapping,
            k_cache=k_cache, v_cache=v_cache, num_heads=num_heads, config=cfg,
            **self.path.launch)
        return q, (x if x_sum is None else x_sum)

    def _forward_fused(self, x, residual, positions, ctx, kv, cos_sin, num_heads, eps):
        """The hidden state is x + residual (residual None: x is whole). Per GEMM, the fused
        kernel (norm prologue, SiLU*up or residual epilogue) or cuBLAS and the separate ops, as
        `self.path.pick` says; a cuBLAS o or down leaves its residual add pending, so that the
        next norm (add_rms_norm, or the fused kernel's prologue) does it, as on the present
        path."""
        t, launch = x.shape[0], self.path.launch
        fused = self._qkv_rope(x, residual, positions, ctx, kv, cos_sin, num_heads, eps)
        if fused is not None:
            q, x = fused
            attn = self._attention(q, ctx, kv)
        else:
            qkv, x = self._qkv(x, residual, eps)
            attn = self._attend(qkv, positions, ctx, kv, cos_sin, num_heads, eps)
        x, residual = self._linear_residual(attn.reshape(t, -1), self.o, self.o_bias, x)
        n_inter = self.gate_up.shape[0] // 2
        cfg = self.path.pick("norm_pair", n_inter, self.gate_up.shape[1], x)
        if cfg is not None and residual is not None:
            a, x = fused_add_norm_linear(x, residual, self.gate_up, self.gate_up_bias,
                                         norm=self.post_norm, eps=eps, pair=True, config=cfg,
                                         **launch)
        elif cfg is not None:
            a = fused_linear(x, self.gate_up, self.gate_up_bias, norm=self.post_norm, eps=eps,
                             pair=True, config=cfg, **launch)
        else:
            h, x = add_rms_norm(x, residual, self.post_norm, eps)
            a = silu_and_mul(F.linear(h, self.gate_up, self.gate_up_bias))
        return self._linear_residual(a, self.down, self.down_bias, x)

    def _qkv(self, x, residual, eps):
        """The qkv GEMM with its norm prologue (fused kernel) or add+RMSNorm then cuBLAS:
        (qkv, the hidden state x + residual)."""
        cfg = self.path.pick("norm", self.qkv.shape[0], self.qkv.shape[1], x)
        if cfg is not None and residual is not None:
            return fused_add_norm_linear(x, residual, self.qkv, self.qkv_bias,
                                         norm=self.input_norm, eps=eps, config=cfg,
                                         **self.path.launch)
        if cfg is not None:
            return fused_linear(x, self.qkv, self.qkv_bias, norm=self.input_norm, eps=eps,
                                config=cfg, **self.path.launch), x
        h, x = add_rms_norm(x, residual, self.input_norm, eps)
        return F.linear(h, self.qkv, self.qkv_bias), x

    def _linear_residual(self, a, weight, bias, x) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x + a @ weight^T: (the sum, None) from the fused kernel, or (the product, x) with
        the add left to the next add+norm."""
        cfg = self.path.pick("residual", weight.shape[0], weight.shape[1], a)
        if cfg is None:
            return F.linear(a, weight, bias), x
        return fused_linear(a, weight, bias, residual=x, config=cfg, **self.path.launch), None


class FusedLlamaForCausalLM(nn.Module):
    """The Llama-family causal LM with fused weights; see the module docstring."""

    impl_name = "gapless"

    def __init__(
        self,
        *,
        config: Any,
        generation_config: Any,
        embed: torch.Tensor,
        layers: list[FusedDecoderLayer],
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        cos_sin: torch.Tensor,
        num_heads: int,
        eps: float,
    ) -> None:
        super().__init__()
        self.config = config
        self.generation_config = generation_config
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.layers = nn.ModuleList(layers)
        self.norm = _param(norm)
        tied = lm_head is embed
        self.lm_head = nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False,
                                 device="meta")
        self.lm_head.weight = self.embed_tokens.weight if tied else _param(lm_head)
        self.register_buffer("cos_sin", cos_sin, persistent=False)  # [max_pos, 2, D/2]
        self.num_heads = num_heads
        self.eps = eps
        self.tp: Any = None  # engine.parallel.comm.TPComm on a tensor-parallel rank

    def set_fused_path(self, path: FusedPath) -> None:
        """Select the decode layer (FusedPath.from_config) for every layer."""
        for layer in self.layers:
            layer.path = path

    def fused_path_summary(self) -> str:
        """The decode layer in use, in words (the engine's settings)."""
        path = self.layers[0].path
        words = path.layer
        if path.layer != "cublas" and not path.rotary:
            words += " (separate rotary)"
        return words + (f" + PDL ({path.overlap})" if path.pdl else "")

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int | torch.Tensor = 0,
        use_cache: bool = False,
        gapless: AttnContext | None = None,
        **_: object,
    ) -> CausalLMOutput:
        """input_ids, position_ids [1, T]; logits_to_keep: row indices [S] (long) of the
        tokens whose next-token logits are wanted, or an int n (the last n; 0 = all)."""
        if not isinstance(gapless, AttnContext):
            raise RuntimeError("FusedLlamaForCausalLM runs only inside the gapless engine "
                               "(pass gapless=AttnContext(...))")
        if input_ids.shape[0] != 1:
            raise ValueError(f"the flat batch is [1, T]; got input_ids {tuple(input_ids.shape)}")
        ids, positions = input_ids[0], position_ids[0]
        tp = self.tp
        x = self.embed_tokens(ids) if tp is None else tp.embed(self.embed_tokens.weight, ids)
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, positions, gapless, gapless.kv_caches[i],
                                self.cos_sin, self.num_heads, self.eps)
        if isinstance(logits_to_keep, torch.Tensor):
            x = x[logits_to_keep]
            residual = None if residual is None else residual[logits_to_keep]
        elif logits_to_keep:
            x = x[-logits_to_keep:]
            residual = None if residual is None else residual[-logits_to_keep:]
        h, _ = add_rms_norm(x, residual, self.norm, self.eps)
        logits = self.lm_head(h)
        if tp is not None:
            logits = tp.gather_logits(logits)
        return CausalLMOutput(logits=logits[None])
