"""Compiling a Triton kernel for an H100/H200 (sm_90) on a machine without a GPU.

Real compilation catches what the Triton interpreter lets through (constexpr misuse, pointer
arithmetic types, casts, shared memory, spills), and its PTX shows where instructions land
(PDL's wait and trigger, L2 prefetches, barriers). The kernel tests of tests/attention and
tests/model build the argument signature the JIT would (constexprs, pointer and scalar
types, 16-divisible arguments) and compile through `compile_sm90`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def ptxas_available() -> bool:
    """Whether Triton finds a ptxas to assemble with (the sm_90 tests skip without one)."""
    try:
        from triton import knobs

        return Path(knobs.nvidia.ptxas.path).exists()
    except Exception:
        return False


NO_PTXAS = "Triton finds no ptxas to assemble with"


def signature(kernel: Any, const: dict, arg_type: Callable[[str], str]) -> dict[str, str]:
    """Each argument's type for the compiler: "constexpr" for those in `const`, else
    arg_type(name) ("*bf16", "i32", "fp32"...)."""
    return {n: "constexpr" if n in const else arg_type(n) for n in kernel.arg_names}


def compile_sm90(kernel: Any, const: dict, sig: dict[str, str], aligned: Iterable[str],
                 **options: Any) -> Any:
    """triton.compile of `kernel` for sm_90 with `const`, the signature `sig` and the
    arguments in `aligned` known divisible by 16 (as the JIT specialises pointers and
    strides), under `options` (num_warps, num_stages)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(ASTSource(kernel, sig, const, attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)
