"""Reference outputs and invariants shared by the engine tests."""

from __future__ import annotations

from pathlib import Path

import torch

from engine import Engine


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int,
              device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[list[int]]:
    """transformers' own model.generate, one prompt at a time, greedy, no EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=device)
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
        out.append(g[0, len(p):].tolist())
    return out


def mixed_prompts(n: int = 9, vocab: int = 300, seed: int = 0) -> list[list[int]]:
    """Prompts of very different lengths (1 to ~70 tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 3, 7, 12, 20, 33, 48, 70, 5, 26, 2, 41][:n]
    return [torch.randint(1, vocab, (n_,), generator=g).tolist() for n_ in lengths]


def assert_all_blocks_free(engine: Engine) -> None:
    """Nothing held: no KV block, no token-table row, no queued or running request."""
    sch = engine.scheduler
    alloc = sch.allocator
    assert alloc.num_used == 0, f"{alloc.num_used} KV blocks still allocated"
    assert alloc.num_free == alloc.num_blocks
    assert sch.num_free_rows == sch.max_num_seqs, (
        f"{sch.max_num_seqs - sch.num_free_rows} token-table rows still held")
    assert not sch.running and not sch.waiting
