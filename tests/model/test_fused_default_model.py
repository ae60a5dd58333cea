"""The shipped model (a Llama with tied embeddings) through the fused forward: the same
next-token logits as transformers' modeling code over a real Python snippet, and 'auto'
serves it with the fused path, greedy tokens equal to generate's."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "engine"))

from engine_checks import hf_greedy  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.model.loader import load_model_and_tokenizer  # noqa: E402
from engine.model.scoring import sequence_logits  # noqa: E402
from engine.model.weights import build_fused_model  # noqa: E402

MODEL_DIR = ROOT / "models" / "gapless-tiny-python"
SNIPPET = ROOT / "tests" / "data" / "heldout_snippet.py.txt"


def test_fused_logits_equal_transformers_on_the_shipped_model() -> None:
    cfg = EngineConfig(model=str(MODEL_DIR), device="cpu", dtype="float32")
    hf, tok = load_model_and_tokenizer(cfg, torch.device("cpu"), torch.float32)
    fused = build_fused_model(hf)
    assert fused.lm_head.weight is fused.embed_tokens.weight, "tied embeddings stay tied"
    ids = tok(SNIPPET.read_text(encoding="utf-8"))["input_ids"][:200]
    want = sequence_logits(hf, ids)
    got = sequence_logits(fused, ids)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 1e-3 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_auto_serves_the_shipped_model_with_the_fused_path() -> None:
    tok_prompts = ["def fibonacci(n):\n", "import os\nfor name in os.listdir("]
    with Engine(EngineConfig(model=str(MODEL_DIR), device="cpu", max_num_batched_tokens=8,
                             block_size=4)) as eng:
        assert eng.settings()["model_impl"] == "gapless"
        prompts = [eng.tokenizer(p)["input_ids"] for p in tok_prompts]
        outs = eng.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0,
                                                    ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy(MODEL_DIR, prompts, 16)
