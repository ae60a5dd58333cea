"""The model runner: device state and the per-step device program.

Owns the paged KV cache tensors, the device token table (the carry-over of sampled tokens),
and `compute()`, the work queued on the compute stream for one step: gather input ids, run
the model with our attention context, sample, scatter the new tokens into the table, copy
them to the slot's output buffer. compute() reads only static per-slot buffers, so a CUDA
graph can capture it. Never decides what to run (that is the scheduler's job).

On a tensor-parallel rank (`tp`: a `RankComm`, which engine.parallel.comm.TPComm is; step/
sits below parallel/ and never imports it), the KV cache holds the rank's share of the KV
heads, and compute() first receives rank 0's input buffer (a broadcast on the device, inside
the step, so a graph captures it too); every rank then samples the same tokens from the same
gathered logits, so every rank's token table stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.interface import AttnContext, Backend
from engine.core.batch import BufferLayout
from engine.core.scratch import PAD_ROW, Scratch
from engine.model.hf_config import kv_cache_shape
from engine.step.protocols import RankComm
from engine.step.sampler import sample


@dataclass(slots=True)
class DeviceView:
    """Views of one slot's device input buffer (int32) and its output buffer."""

    buf: torch.Tensor
    out: torch.Tensor  # [max_seqs] int64 sampled tokens
    ids: torch.Tensor
    from_table: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    token_req: torch.Tensor
    block_tables: torch.Tensor
    sample_idx: torch.Tensor
    sample_row: torch.Tensor
    sample_pos: torch.Tensor
    top_k: torch.Tensor
    seed: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor

    @classmethod
    def allocate(cls, layout: BufferLayout, device: torch.device) -> DeviceView:
        buf = torch.zeros(layout.size, dtype=torch.int32, device=device)
        out = torch.zeros(layout.max_seqs, dtype=torch.int64, device=device)
        return cls(buf=buf, out=out, **layout.views(buf, torch.float32))


class ModelRunner:
    """Device state of the engine. `num_blocks` counts every KV block, the scratch one too:
    the allocator may hand out `num_cache_blocks` of them, and `scratch` says where padding
    goes (the last block; the token table's extra last row)."""

    def __init__(
        self,
        model: torch.nn.Module,
        backend: Backend,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        *,
        tp: RankComm | None = None,
    ) -> None:
        self.model = model
        self.tp = tp
        self.backend = backend
        self.device = device
        self.dtype = dtype
        layers, kv_heads, head_dim = kv_cache_shape(model.config, 1 if tp is None else tp.world)
        shape = (num_blocks, block_size, kv_heads, head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(layers)
        ]
        # One row more than the scheduler hands out: the scratch row, last, so that PAD_ROW
        # (-1) as an index lands on it.
        self.token_table = torch.zeros(
            (max_num_seqs + 1, max_model_len + 1), dtype=torch.int64, device=device
        )
        self.num_cache_blocks = num_blocks - 1
        self.scratch = Scratch(kv_slot=self.num_cache_blocks * block_size, table_row=PAD_ROW)

    def compute(self, v: DeviceView, num_tokens: int, num_samples: int, greedy_only: bool) -> None:
        """Queue one step's device work on the current stream (or capture it)."""
        t, s = num_tokens, num_samples
        if self.tp is not None:
            self.tp.broadcast_inputs(v.buf)
        positions = v.positions[:t]
        rows = v.token_req[:t]  # padding's PAD_ROW (-1) reads the scratch row
        from_table = self.token_table[rows, positions]
        ids = torch.where(v.from_table[:t].bool(), from_table, v.ids[:t].long())
        ctx = AttnContext(
            kv_caches=self.kv_caches,
            slot_mapping=v.slot_mapping[:t].long(),
            block_tables=v.block_tables,
            token_req=v.token_req[:t],
            token_pos=positions,
            backend=self.backend,
        )
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            logits_to_keep=v.sample_idx[:s].long(),
            use_cache=False,
            gapless=ctx,
        )
        logits = out.logits[0]
        sample_pos = v.sample_pos[:s]
        tokens = sample(
            logits,
            v.temperature[:s],
            v.top_k[:s],
            v.top_p[:s],
            v.seed[:s],
            sample_pos,
            greedy_only,
        )
        self.token_table[v.sample_row[:s].long(), sample_pos.long()] = tokens
        v.out[:s].copy_(tokens)
