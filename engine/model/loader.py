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


def looks_like_path(source: str) -> bool:
    """A model string that names a folder rather than a hub id ("org/name"): it starts like
    a path, or has more than one "/", or its first part is a folder here (models/...)."""
    if source.startswith(("/", "./", "../", "~", ".\\")) or source in (".", ".."):
        return True
    parts = source.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).expanduser().is_dir())


def load_model_and_tokenizer(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """Returns (model, tokenizer), the model in eval mode on `device` with our attention.

    A model (or tokenizer) string that looks like a path must be an existing folder: it is
    refused at once, never looked up on the Hub (offline, that lookup takes most of a minute
    to fail). Anything else is a hub id, tried locally first when HF_HUB_OFFLINE is set."""
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    # Where to look, decided before importing transformers (seconds): a missing folder is
    # reported at once.
    source, kwargs = _source("model", cfg.model, offline)
    kwargs["trust_remote_code"] = cfg.trust_remote_code
    tok_source, tok_kwargs = (source, dict(kwargs)) if cfg.tokenizer is None else _source(
        "tokenizer", cfg.tokenizer, offline)
    tok_kwargs["trust_remote_code"] = cfg.trust_remote_code

    from transformers import AutoModelForCausalLM, AutoTokenizer

    attention.register()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attention.ATTN_IMPLEMENTATION, **kwargs
        )
    except (OSError, ValueError) as e:
        where = "a local folder" if kwargs.get("local_files_only") else "a local folder or a " \
            "reachable hub id"
        raise ValueError(
            f"could not load model {cfg.model!r}: it is not {where} with a causal LM "
            f"(offline={offline}). Cause: {e}"
        ) from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_source, **tok_kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(
            f"could not load the tokenizer from {cfg.tokenizer or cfg.model!r} "
            f"(the {'tokenizer' if cfg.tokenizer else 'model'} setting): {e}"
        ) from e
    return prepare_model(model, device, dtype), tokenizer


def _source(key: str, value: str, offline: bool) -> tuple[str, dict[str, Any]]:
    """Where from_pretrained should look for `value`, and with which flags."""
    local = Path(value).expanduser()
    if local.is_dir():
        return str(local), {"local_files_only": True}
    if local.exists():
        raise ValueError(f"could not load {key} {value!r}: it is a file; give a folder or a "
                         "hub id")
    if looks_like_path(value):
        raise ValueError(
            f"could not load {key} {value!r}: no such folder (relative to {Path.cwd()}; a "
            "relative path in a config file is tried beside the file first), and it is not "
            "a hub id ('org/name'); give an existing folder or a hub id (scripts/setup.sh "
            "makes the default model, models/SmolLM2-135M-Instruct; models/gapless-tiny-python "
            "ships with the repository)"
        )
    return value, {"local_files_only": True} if offline else {}


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


def select_model_impl(model: torch.nn.Module, choice: str, max_positions: int,
                      owned: bool) -> tuple[torch.nn.Module, str]:
    """(model to run, 'gapless' | 'transformers') for config key `model_impl`.

    'auto' runs our fused Llama-family forward where the model maps onto it and transformers'
    modeling code otherwise; 'gapless' insists (ValueError naming the key if it cannot);
    'transformers' keeps the loaded model. `owned`: the loader made the model, so the fused
    build may release the originals it replaces.
    """
    if choice == "transformers":
        return model, "transformers"
    from engine.model.weights import build_fused_model, unsupported_reason

    reason = unsupported_reason(model)
    if reason is not None:
        if choice == "gapless":
            raise ValueError(f"model_impl 'gapless' cannot run this model: {reason}; "
                             "use model_impl 'auto' or 'transformers'")
        return model, "transformers"
    return build_fused_model(model, max_positions, consume=owned), "gapless"
