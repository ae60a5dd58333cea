"""gapless engine: continuous batching over a paged KV cache, sync or async steps.

engine/ never imports streamlit, plotly or anything under ui/ or pages/.
"""

from engine.config import EngineConfig, SamplingParams
from engine.engine import Engine, RequestHandle
from engine.request import RequestOutput

__all__ = ["Engine", "EngineConfig", "RequestHandle", "RequestOutput", "SamplingParams"]
