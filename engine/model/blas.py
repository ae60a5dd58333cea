"""Which BLAS library torch's GEMMs use on CUDA (config key `blas_library`).

torch routes bf16/fp16 matrix products through cuBLAS by default; `cublaslt` makes it prefer
cuBLASLt, whose heuristics pick other kernels for the skinny decode GEMMs (M = batch): on
Hopper it splits K less, so a large model's decode step runs fewer separate reduce kernels
(docs/benchmarks.md). The choice is torch's process-wide setting: the engine owns its process
(or it is the process's one engine), so it is set once, when the engine is built. `default`
leaves torch's own choice (and TORCH_BLAS_PREFER_CUBLASLT) alone; `auto` (the default) is
cuBLASLt on Hopper (compute capability 9.0, where it is measured faster or equal) and torch's
choice on every other GPU.
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
