"""The persistent layer's launch on the H200 (engine/model/persistent_step.py `_tiles`), host
only: the tiles the sm_90 compile test checks (test_persistent_layer.SM90_SHAPES) are the ones
the engine picks at SmolLM2-135M batch 16 and Llama-3.2-1B batch 1 from the committed
gemm_table.json, attention runs the one-split decode launch, and the grid is the largest
phase's tile count, at most one program per SM.
"""

from __future__ import annotations

import pytest
import torch
from test_fused_ops import IN_INTERPRETER
from test_persistent_layer import CUDA_SHAPES, SM90_SHAPES


@pytest.mark.skipif(IN_INTERPRETER, reason="host-side only")
@pytest.mark.parametrize(("compiled", "shape", "programs"),
                         [("smollm2", "smollm2-135m-b16", 60), ("llama1b", "llama-3.2-1b-b1", 132)])
def test_h200_tiles_are_the_compiled_ones(compiled, shape, programs, monkeypatch) -> None:
    from engine.model import gemm_table, persistent_step

    monkeypatch.setattr(gemm_table, "device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(persistent_step, "max_programs", lambda device: 132)
    persistent_step._tiles.cache_clear()
    try:
        hidden, heads, kvh, d, inter, t, _ = CUDA_SHAPES[shape]
        tiles = persistent_step._tiles(t, torch.device("cuda", 0), torch.bfloat16, hidden, inter,
                                       (heads + 2 * kvh) * d, heads, kvh, d, 2)
    finally:
        persistent_step._tiles.cache_clear()
    want = SM90_SHAPES[compiled][3]
    assert SM90_SHAPES[compiled][:3] == (heads, kvh, d)
    assert dict(qkv=tiles.qkv, o=tiles.o, gate_up=tiles.gate_up, down=tiles.down) == want
    assert (tiles.block_m, tiles.att_block_n, tiles.table_ahead) == (16, 64, True)
    assert tiles.programs == programs


@pytest.mark.skipif(IN_INTERPRETER, reason="host-side only")
def test_two_programs_an_sm_only_where_a_phase_has_the_tiles(monkeypatch) -> None:
    """GAPLESS_PERSISTENT_PER_SM=2: Llama-3.2-1B b1's gate_up has 256 tiles, so 256 programs
    (<= 2 x 132); SmolLM2 b16's largest phase has 60, so the grid stays 60."""
    from engine.model import gemm_table, persistent_step

    monkeypatch.setattr(gemm_table, "device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(persistent_step, "max_programs", lambda device: 132)
    got = {}
    for shape in ("llama-3.2-1b-b1", "smollm2-135m-b16"):
        hidden, heads, kvh, d, inter, t, _ = CUDA_SHAPES[shape]
        persistent_step._tiles.cache_clear()
        got[shape] = persistent_step._tiles(t, torch.device("cuda", 0), torch.bfloat16, hidden,
                                            inter, (heads + 2 * kvh) * d, heads, kvh, d, 2,
                                            2).programs
    persistent_step._tiles.cache_clear()
    assert got == {"llama-3.2-1b-b1": 256, "smollm2-135m-b16": 60}
