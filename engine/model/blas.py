"""Which BLAS library torch's GEMMs use on CUDA (config key `blas_library`, issue 22).

torch routes bf16/fp16 matrix products through cuBLAS by default; `cublaslt` makes it prefer
cuBLASLt, whose heuristics pick other kernels for the skinny decode GEMMs (M = batch). On the
H200 (2026-12-04, main fac0c88, `python -m bench anatomy --preset llama-8b --batches 32
--impls gapless --fused-layer plain` with TORCH_BLAS_PREFER_CUBLASLT=1) the 8B decode step went
from 373 kernels and 5,206 us to 309 and 5,024 us: cuBLASLt split K less (no separate reduce
kernels). Llama-3.2-1B at batch 1 and 32 did not change. The choice is torch's process-wide
setting: the engine owns its process (or it is the process's one engine), so it is set once,
when the engine is built. `default` leaves torch's own choice (and TORCH_BLAS_PREFER_CUBLASLT)
alone; `auto` (the default) is cuBLASLt on Hopper (compute capability 9.0, where it was
measured: also 8B 32 x (256 + 1024) 5.80 s against 5.98 s with cuBLAS in the same call, and
SmolLM2-135M b16, Qwen3-0.6B b32 unchanged) and torch's choice on every other GPU.
"""

from __future__ import annotations

import torch


def apply_blas_library(choice: str, device: torch.device) -> str:
    """Set torch's preferred BLAS on CUDA; what GEMMs use now ("n/a (cpu)" on a CPU)."""
    if device.type != "cuda":
        return "n/a (cpu)"
    if choice == "auto":
        choice = "cublaslt" if torch.cuda.get_device_capability(device) == (9, 0) else "default"
    if choice != "default":
        torch.backends.cuda.preferred_blas_library(choice)
    return str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()
