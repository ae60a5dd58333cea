"""The torch reference paged attention against dense causal attention (CPU, fp32/fp16/bf16):
mixed decode and prefill batches, GQA, sliding window, padding, interleaved tokens."""

from __future__ import annotations

import pytest
import torch
from paged_batches import (
    MIXED,
    TOL,
    assert_padding_zero,
    dense_attention,
    make_batch,
    rel_err,
    run_ref,
)

from engine.attention.reference import paged_attention as ref_attention

# --------------------------------------------------------------------------- (a) reference


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("sliding_window", [None, 5])
@pytest.mark.parametrize("block_size", [16, 32])
def test_reference_matches_dense_attention(
    heads: int, kv_heads: int, sliding_window: int | None, block_size: int
) -> None:
    b = make_batch(
        MIXED, heads=heads, kv_heads=kv_heads, head_dim=32, block_size=block_size,
        dtype=torch.float32, padding=3, seed=heads * 10 + kv_heads,
    )
    out = run_ref(b, sliding_window)
    assert rel_err(out, dense_attention(b, sliding_window)) < TOL[torch.float32]
    assert_padding_zero(b, out)


def test_reference_handles_interleaved_tokens() -> None:
    b = make_batch(
        MIXED, heads=8, kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32,
        padding=2, shuffle_tokens=True, seed=3,
    )
    out = run_ref(b)
    assert rel_err(out, dense_attention(b, None)) < TOL[torch.float32]
    assert_padding_zero(b, out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_low_precision(dtype: torch.dtype) -> None:
    b = make_batch(MIXED, heads=8, kv_heads=2, head_dim=64, block_size=16, dtype=dtype, seed=4)
    out = run_ref(b, None)
    assert out.dtype == dtype
    assert rel_err(out, dense_attention(b, None)) < TOL[dtype]


def test_reference_window_one_is_own_value() -> None:
    b = make_batch(MIXED, heads=4, kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    out = run_ref(b, sliding_window=1)
    for i, (r, p) in enumerate(zip(b.token_req.tolist(), b.token_pos.tolist(), strict=True)):
        own = b.values[r][p].repeat_interleave(2, dim=0)  # [H, D]
        torch.testing.assert_close(out[i], own)


def test_reference_rejects_mismatched_heads() -> None:
    b = make_batch([(1, 4)], heads=6, kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        ref_attention(
            b.q[:, :5], b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, 1.0
        )
