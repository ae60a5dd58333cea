"""gapless engine: continuous batching over a paged KV cache, sync or async steps.

engine/ never imports streamlit, plotly or anything under ui/. The names below are
loaded lazily, so `from engine.process.client import EngineClient` (the dashboard's only door into
the engine) does not import torch or transformers into the dashboard process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig, SamplingParams
    from engine.core.request import RequestOutput
    from engine.engine import Engine, RequestHandle

__all__ = ["Engine", "EngineConfig", "RequestHandle", "RequestOutput", "SamplingParams"]

_WHERE = {
    "Engine": "engine.engine",
    "RequestHandle": "engine.engine",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.config",
    "RequestOutput": "engine.core.request",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
