"""torch_compile (the generic path, transformers' modeling code, compiled with our attention as
the custom op gapless::paged_attention), on CPU in fp32: greedy output equals the eager engine
and transformers' model.generate token for token, with chunked prefill and preemption forced,
for a tiny Llama and a tiny Qwen2; the compiled forward has no graph break (dynamo never
traces into the attention's Python) and stays under dynamo's recompile limit; the op passes
torch.library.opcheck; bad settings are clear errors.

Compiling is slow on a small CPU (tens of seconds a graph when inductor's cache is cold), so
each family runs one compiled engine for the whole module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

MAX_NEW = 12
# A budget of 16 tokens forces chunked prefill (prompts up to 70 tokens); 24 usable blocks of
# 4 tokens cannot hold 9 requests at once: preemption.
TIGHT = dict(
    device="cpu",
    max_num_seqs=6,
    max_num_batched_tokens=16,
    block_size=4,
    num_blocks=25,
    max_model_len=96,
)


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return counters


@pytest.fixture(scope="module")
def compiled_runs(tiny_model_dir):
    """family -> (outputs, stats, settings, graphs compiled, graph breaks) of one compiled
    engine serving the mixed prompts; each family starts from a reset dynamo (as a fresh
    engine process does), so the graph count is its own."""
    cache: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in cache:
            torch._dynamo.reset()
            _counters().clear()
            cfg = EngineConfig(
                model=str(tiny_model_dir(family)),
                model_impl="transformers",
                torch_compile=True,
                async_batching=True,
                **TIGHT,
            )
            with Engine(cfg) as eng:
                outs = eng.generate(
                    mixed_prompts(9),
                    SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True),
                )
                stats, info = eng.stats(), eng.settings()
                assert_all_blocks_free(eng)
            c = _counters()
            cache[family] = (
                outs,
                stats,
                info,
                int(c["stats"]["unique_graphs"]),
                dict(c["graph_break"]),
            )
        return cache[family]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_compiled_greedy_matches_eager_and_generate(tiny_model_dir, compiled_runs, family):
    model_dir = tiny_model_dir(family)
    prompts = mixed_prompts(9)
    outs, stats, info, graphs, breaks = compiled_runs(family)
    assert info["model_impl"] == "transformers" and info["torch_compile"] is True
    assert graphs > 0, "nothing was compiled: the setting did not reach the forward"
    assert stats["preemptions"] > 0, "the workload was meant to force preemption"
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    cfg = EngineConfig(
        model=str(model_dir), model_impl="transformers", async_batching=True, **TIGHT
    )
    with Engine(cfg) as eng:
        eager = eng.generate(
            prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
        )
        assert eng.settings()["torch_compile"] is False
    for p, o, g, e in zip(prompts, outs, eager, expected, strict=True):
        assert o.token_ids == e, f"{family}: compiled, prompt of {len(p)} tokens diverged"
        assert o.token_ids == g.token_ids


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_compiled_forward_has_no_graph_break_and_few_graphs(compiled_runs, family):
    """A graph break would mean dynamo traced into our attention (the torch reference reads
    the longest position to the host); past the recompile limit dynamo runs new shapes
    eagerly without saying so in the output."""
    _, _, _, graphs, breaks = compiled_runs(family)
    assert breaks == {}, f"graph breaks in the compiled forward: {breaks}"
    assert graphs < torch._dynamo.config.recompile_limit, (
        f"{graphs} graphs for one engine reach dynamo's recompile limit"
    )


def _op_args(t: int = 5, window: int | None = None) -> tuple:
    g = torch.Generator().manual_seed(0)
    num_blocks, block, kvh, d, h = 6, 4, 2, 16, 4
    q = torch.randn(h, t, d, generator=g).transpose(0, 1)  # strided, as the model hands it
    k_cache = torch.randn(num_blocks, block, kvh, d, generator=g)
    v_cache = torch.randn(num_blocks, block, kvh, d, generator=g)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    req = torch.tensor([0, 0, 0, 1, -1], dtype=torch.int32)[:t]
    pos = torch.tensor([3, 4, 5, 9, 0], dtype=torch.int32)[:t]
    return q, k_cache, v_cache, tables, req, pos, "torch", 0.25, window


@pytest.mark.parametrize("window", [None, 3])
def test_custom_op_passes_opcheck_and_matches_the_backend(window):
    from engine.attention.op import as_custom_op, paged_attention
    from engine.attention.reference import paged_attention as reference

    as_custom_op("torch", reference)
    args = _op_args(window=window)
    torch.library.opcheck(paged_attention, args)
    out = paged_attention(*args)
    assert out.is_contiguous()
    torch.testing.assert_close(
        out, reference(*args[:6], scale=0.25, sliding_window=window), rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(torch_compile="yes"), "torch_compile must be true or false, got 'yes'"),
        (dict(torch_compile=1), "torch_compile must be true or false, got 1"),
        (
            dict(torch_compile=True, model_impl="gapless"),
            "torch_compile compiles transformers' modeling code; it needs model_impl "
            "'transformers' or 'auto'",
        ),
    ],
)
def test_bad_torch_compile_settings_are_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        EngineConfig(**settings).validate()


def test_auto_on_the_fused_path_does_not_compile(tiny_model_dir):
    cfg = EngineConfig(
        model=str(tiny_model_dir("llama")), model_impl="auto", torch_compile=True, **TIGHT
    )
    with Engine(cfg, start=False) as eng:
        assert eng.settings()["model_impl"] == "gapless"
        assert eng.settings()["torch_compile"] is False
