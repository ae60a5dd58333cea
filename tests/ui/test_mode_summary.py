"""The one-line summary of what the engine runs names a compiled forward."""

from __future__ import annotations

from ui.widgets.controls import mode_summary

SETTINGS = {
    "async_batching": True,
    "num_slots": 2,
    "cuda_graphs": False,
    "device": "cpu",
    "model": "m",
    "dtype": "float32",
    "model_impl": "transformers",
}


def test_the_summary_says_when_the_forward_is_compiled() -> None:
    assert mode_summary(SETTINGS).endswith("forward transformers")
    compiled = mode_summary({**SETTINGS, "torch_compile": True})
    assert compiled.endswith("forward transformers (torch.compile)")
    assert mode_summary({**SETTINGS, "torch_compile": False}) == mode_summary(SETTINGS)
