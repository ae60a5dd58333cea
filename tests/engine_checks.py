"""Reference outputs and invariants shared by the engine tests."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine import Engine, EngineConfig, SamplingParams


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


def assert_all_blocks_free(engine: Engine, timeout_s: float = 10.0) -> None:
    """Nothing held: no KV block, no token-table row, no queued or running request.

    The last request's end is delivered while the step after it may still be in flight
    (async batching): its blocks come free once that step completes (the deferred-free guard).
    A threaded engine gets there on its own; a manually stepped one is stepped to idle."""
    sch = engine.scheduler
    alloc = sch.allocator
    deadline = time.monotonic() + timeout_s
    while alloc.num_deferred and time.monotonic() < deadline:
        if engine._thread is None:
            engine.step()
        else:
            time.sleep(0.005)
    assert alloc.num_used == 0, f"{alloc.num_used} KV blocks still allocated"
    assert alloc.num_free == alloc.num_blocks
    assert sch.num_free_rows == sch.max_num_seqs, (
        f"{sch.max_num_seqs - sch.num_free_rows} token-table rows still held")
    assert not sch.running and not sch.waiting


class PoisonedTokenizer:
    """Decodes like the real tokenizer, except that any text holding `poison` raises (a
    request's own fault, for the fault tests)."""

    def __init__(self, real, poison: int) -> None:
        self.real, self.poison = real, poison

    def __call__(self, *a, **k):
        return self.real(*a, **k)

    def decode(self, ids, **k):
        if self.poison in ids:
            raise RuntimeError(f"cannot decode token {self.poison}")
        return self.real.decode(ids, **k)

    def __getattr__(self, name):
        return getattr(self.real, name)


# A small bf16 engine on the GPU: few blocks and a small token budget, so the tiny models'
# prompts are chunked and preempted.
TIGHT_CUDA = dict(device="cuda", dtype="bfloat16", max_num_seqs=6, max_num_batched_tokens=16,
                  block_size=16, num_blocks=9, max_model_len=96, attention_backend="triton")


def cuda_engine_outputs(model_dir: Path, prompts: list[list[int]], max_new_tokens: int,
                        **config: object) -> tuple[list[list[int]], dict, dict]:
    """Greedy tokens (EOS ignored) of an engine on TIGHT_CUDA with `config` over it, with its
    stats and settings; every block is free once the prompts are done."""
    with Engine(EngineConfig(model=str(model_dir), **{**TIGHT_CUDA, **config})) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0.0,
                                                    ignore_eos=True))
        stats, settings = eng.stats(), eng.settings()
        assert_all_blocks_free(eng)
    return [o.token_ids for o in outs], stats, settings


# On the CPU, sync, our forward: a cache small enough that the 9 mixed prompts preempt.
TIGHT_CPU = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
                 num_blocks=25, max_model_len=96, async_batching=False, model_impl="gapless")


def cpu_engine_outputs(model_dir: Path, prompts: list[list[int]], max_new_tokens: int,
                       **config: object) -> tuple[list[list[int]], dict]:
    """Greedy tokens (EOS ignored) of an engine on TIGHT_CPU with `config` over it, and its
    stats."""
    with Engine(EngineConfig(model=str(model_dir), **{**TIGHT_CPU, **config})) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0.0,
                                                    ignore_eos=True))
        return [o.token_ids for o in outs], eng.stats()
