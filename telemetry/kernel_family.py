"""A kernel's family, told by its name, and the colour every view draws that family in.

Owns the one classifier and the one colour map that the kernel lane, the Step anatomy page,
the kernel samples, the anatomy recording and `python -m bench anatomy` share, so a kernel
has one family and a family one colour wherever it is shown. The families:

    gemm         matrix multiplies (cuBLAS, CUTLASS, nvjet, our fused linear kernels)
    attention    attention and its split-K reduce
    norm         RMSNorm / LayerNorm and the pieces an unfused norm runs (mean, pow, rsqrt)
    rotary       rotary position embedding (our fused rope + KV write, an unfused rope's
                 cos, sin and negation)
    elementwise  activations, casts, torch's vectorized and reduce kernels
    sampling     argmax, sort, top-k/top-p, softmax, multinomial, Gumbel noise
    copies       device copies, memsets, index/gather/scatter, concatenation, embedding lookup
    other        a name no rule knows: shown as such, never hidden inside another family
    marker       the one-element kernel our CUDA graphs start with (engine/step/graphs.py runs
                 bitwise_not_ on one int32) so an in-graph timing event fires when kernels
                 run: ours, not the model's

Names may also be torch CPU op names ("aten::mm"), as the anatomy reads them in tests on a CPU.
Pure: no torch, no clocks, nothing of ours; it must never import UI code.
"""

from __future__ import annotations

import re

FAMILIES: tuple[str, ...] = ("gemm", "attention", "norm", "rotary", "elementwise", "sampling",
                             "copies", "other", "marker")
# ColorBrewer's "Paired": twelve hues told apart on a white page, none of them the timeline's
# compute green or its CPU blues at full strength.
FAMILY_COLOURS: dict[str, str] = {
    "gemm": "#6a3d9a",
    "attention": "#e31a1c",
    "norm": "#ff7f00",
    "rotary": "#fb9a99",
    "elementwise": "#33a02c",
    "sampling": "#1f78b4",
    "copies": "#b15928",
    "other": "#cab2d6",
    "marker": "#999999",
}
MARKER_PATTERN = re.compile(r"bitwise_not", re.IGNORECASE)
# First match wins. The marker first (CUDA names it "...vectorized_elementwise_kernel<4,
# ...bitwise_not_kernel_cuda...", which the elementwise rule would take); attention before
# gemm (flash kernels are called "...splitkv..."); gemm before rotary (our qkv GEMM with the
# rope fused in is a GEMM by its time) and before copies (CUTLASS templates name "Copy"
# atoms); sampling before copies (torch's gatherTopK); norm before copies (a compiled
# norm's name holds "_to_copy"); the broad elementwise rule last.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (("marker", MARKER_PATTERN),) + tuple(
    (family, re.compile(pattern, re.IGNORECASE)) for family, pattern in (
        ("attention", r"attn|attention|flash|fmha|sdpa|paged|reduce_splits|aten::bmm"),
        ("gemm", r"gemm|gemv|matmul|cutlass|cublas|nvjet|xmma|sm\d+_|splitk|fused_linear"
                 r"|gate_up_silu|triton_tem|aten::mm\b|aten::addmm|aten::linear"),
        ("sampling", r"sample|topk|top_k|argmax|argmin|multinomial|sort|cumsum|gumbel"
                     r"|exponential|softmax|radix"),
        ("norm", r"rms_?norm|layer_?norm|norm_kernel|meanops|pow_tensor|rsqrt|aten::norm"),
        ("rotary", r"rotary|_rope|\brope|cos_kernel|sin_kernel|neg_kernel"),
        ("copies", r"memcpy|memset|copy|index|gather|scatter|embedding"),
        ("elementwise", r"elementwise|vectorized|unrolled|reduce|silu|gelu|act_and_mul"
                        r"|activation|fill|where|triton_poi|triton_red|triton_per|aten::"),
    ))


def family_of(name: str) -> str:
    """The family of a kernel (or CPU op) by its name: one of FAMILIES, "other" when no rule
    matches."""
    for family, pattern in _RULES:
        if pattern.search(name):
            return family
    return "other"


def colour_of(family: str) -> str:
    """The family's colour; a family this module does not know (an old recording's) is drawn
    as "other"."""
    return FAMILY_COLOURS.get(family, FAMILY_COLOURS["other"])
