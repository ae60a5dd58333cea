"""torch.compile of the generic path: transformers' modeling code with our attention as a
custom op (config key `torch_compile`).

Owns how the forward is compiled: mode "default" (the engine captures CUDA graphs itself,
engine.step.graphs, so inductor must not: "reduce-overhead" would capture graphs inside our
graphs); automatic dynamic shapes (`dynamic=None`: the first shape compiles static, and only
the sizes that then change, the token count and the number of sampled rows, turn dynamic;
the KV cache and block tables never change shape and stay static. `dynamic=True` would
make the cache's dims symbolic too, and duck sizing then ties the token count to head_dim
when they happen to be equal); and the attention backend routed through
`gapless::paged_attention` so dynamo never traces into it. Dynamo always specialises sizes 0
and 1, so an engine settles on about 4-6 graphs (one token; 0 or 1 sampled rows; any other
count), below its limit of 8 per function (past it, new shapes would run eagerly: correct,
slower). Compilation happens at the first forward of each shape class: in the engine's first
steps, or in CUDA graph warm-up, which runs compute() twice before capturing, so nothing
compiles under capture.

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
