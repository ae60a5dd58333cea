"""torch.compile of the generic path: transformers' modeling code with our attention as a
custom op (config key `torch_compile`).

Owns how the forward is compiled: mode "default" (the engine captures CUDA graphs itself,
engine.step.graphs, so inductor must not: "reduce-overhead" would capture graphs inside our
graphs), dynamic token counts (a step's token count varies, and sizes 0 and 1 are always
specialised by dynamo, so a run settles on a few graphs: one token, and any other count), and
the attention backend routed through `gapless::paged_attention` so dynamo never traces into
it. Compilation itself happens at the first forward of each shape class, that is in the
engine's warm-up or its first steps; CUDA graph capture runs compute() twice before capturing,
so nothing compiles under capture.

Never used for model_impl 'gapless' (our fused forward); never changes what the model
computes, only how.
"""

from __future__ import annotations

import torch

from engine.attention.interface import Backend
from engine.attention.op import as_custom_op

MODE = "default"


def compile_forward(
    model: torch.nn.Module, backend_name: str, backend: Backend
) -> tuple[torch.nn.Module, Backend]:
    """(model whose calls run compiled, the backend to hand the runner). The model is the
    same object, compiled in place (`nn.Module.compile`), so its config and weights are
    where the runner looks for them."""
    model.compile(mode=MODE, dynamic=None)
    return model, as_custom_op(backend_name, backend)


def is_compiled(model: torch.nn.Module) -> bool:
    return getattr(model, "_compiled_call_impl", None) is not None
