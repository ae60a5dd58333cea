"""Loading a Hugging Face causal LM and its tokenizer, offline-safe, with our attention.

Owns resolving device and dtype, and turning "model not found" into a clear error that
names the model. Any transformers causal LM whose attention goes through the standard
AttentionInterface works; trust_remote_code stays off unless the config turns it on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine.attention import interface as attention
from engine.config import EngineConfig

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use 'cpu'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def load_model_and_tokenizer(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """Returns (model, tokenizer), the model in eval mode on `device` with our attention."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    attention.register()
    source = cfg.model
    local = Path(source).expanduser()
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if local.exists() and not local.is_dir():
        raise ValueError(f"model {source!r} is a file; give a model folder or a hub id")
    if (not local.exists() and not local.is_absolute() and len(local.parts) > 1
            and Path(local.parts[0]).is_dir()):
        # "models/X" with a local models/ folder means a local folder, not a hub id: say so
        # now instead of retrying the hub for a minute.
        raise ValueError(
            f"could not load model {source!r}: there is no such folder (scripts/setup.sh makes "
            "the default model, models/SmolLM2-135M-Instruct; models/gapless-tiny-python "
            "ships with the repository)"
        )
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if local.is_dir():
        source = str(local)
        kwargs["local_files_only"] = True
    elif offline:
        kwargs["local_files_only"] = True
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attention.ATTN_IMPLEMENTATION, **kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or source, **kwargs)
    except (OSError, ValueError) as e:
        where = "a local folder" if local.is_dir() else "a local folder or a reachable hub id"
        raise ValueError(
            f"could not load model {cfg.model!r}: it is not {where} with a causal LM "
            f"(offline={offline}). Cause: {e}"
        ) from e
    return prepare_model(model, device, dtype), tokenizer


def prepare_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> Any:
    """Put a transformers model (loaded or built from a config) on the device with our
    attention; used for models made in memory too (tests, benchmarks)."""
    attention.register()
    model.config._attn_implementation = attention.ATTN_IMPLEMENTATION
    for sub in model.modules():  # nested configs (text_config) follow the top one
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = attention.ATTN_IMPLEMENTATION
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
