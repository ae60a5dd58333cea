"""The torch reference's prefill-chunk form (one gather of a request's context, two matmuls
under a causal mask) against dense attention: long chunks, the score bound forcing several
row blocks, a sliding window, and chunks beside decodes in one batch."""

from __future__ import annotations

import pytest
import torch
from paged_batches import TOL, assert_padding_zero, dense_attention, make_batch, rel_err, run_ref

import engine.attention.reference as reference


@pytest.mark.parametrize("sliding_window", [None, 37])
def test_long_chunks_beside_decodes_match_dense(sliding_window: int | None) -> None:
    # (query tokens, context): two prefill chunks (one a continuation), three decodes.
    specs = [(120, 300), (64, 64), (1, 90), (1, 17), (1, 301)]
    b = make_batch(specs, heads=6, kv_heads=2, head_dim=32, block_size=16,
                   dtype=torch.float32, padding=3, shuffle_tokens=True, seed=7)
    out = run_ref(b, sliding_window)
    assert rel_err(out, dense_attention(b, sliding_window)) < TOL[torch.float32]
    assert_padding_zero(b, out)


def test_score_bound_splits_rows_without_changing_the_answer(monkeypatch) -> None:
    b = make_batch([(96, 200), (1, 50)], heads=8, kv_heads=2, head_dim=16, block_size=16,
                   dtype=torch.float32, seed=8)
    whole = run_ref(b)
    monkeypatch.setattr(reference, "_MAX_SCORE_ELEMENTS", 2 * 200 * 5)  # 5 rows at a time
    split = run_ref(b)
    assert rel_err(split, dense_attention(b, None)) < TOL[torch.float32]
    assert torch.allclose(whole, split, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunk_in_low_precision(dtype: torch.dtype) -> None:
    b = make_batch([(80, 160), (1, 33)], heads=8, kv_heads=2, head_dim=64, block_size=16,
                   dtype=dtype, seed=9)
    out = run_ref(b)
    assert out.dtype == dtype
    assert rel_err(out, dense_attention(b, None)) < TOL[dtype]
