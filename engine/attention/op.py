"""Our paged attention as a torch custom op, so torch.compile sees one opaque call.

Owns the op `gapless::paged_attention` (its fake implementation for tracing, and the table of
backends it dispatches to by name) and `as_custom_op`, which turns a backend into one that
goes through the op. Dynamo must not trace into a backend: the torch reference reads the
batch's longest position to the host and loops over chunks, the Triton one launches a
hand-written kernel. Behind the op both run exactly as they do eagerly.

The op only reads the cache; the K/V write before it (`index_copy_` in
`engine.attention.interface`) stays visible to the compiler, which keeps it in place (checked
in inductor's CPU output code, torch 2.13: a scatter of the step's T rows into the cache,
fused with rotary, and no copy of the whole cache).
Never imports transformers; never used on the eager path (the op's dispatch costs a few
microseconds a layer for nothing there).
"""

from __future__ import annotations

import torch

from engine.attention.interface import Backend

OP_NAME = "gapless::paged_attention"

_BACKENDS: dict[str, Backend] = {}


@torch.library.custom_op(OP_NAME, mutates_args=())
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    backend: str,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """The backend registered as `backend`, writing into a fresh contiguous [T, H, D]."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return _BACKENDS[backend](
        q,
        k_cache,
        v_cache,
        block_tables,
        token_req,
        token_pos,
        scale=scale,
        sliding_window=sliding_window,
        out=out,
    )


@paged_attention.register_fake
def _(q, k_cache, v_cache, block_tables, token_req, token_pos, backend, scale, sliding_window):
    # Same layout as the real op (contiguous, whatever q's strides), so compiled code that
    # reads it agrees with what the backend wrote.
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def as_custom_op(name: str, backend: Backend) -> Backend:
    """`backend` (known as `name`) called through `gapless::paged_attention`."""
    _BACKENDS[name] = backend

    def through_op(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        token_req: torch.Tensor,
        token_pos: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        return paged_attention(
            q, k_cache, v_cache, block_tables, token_req, token_pos, name, scale, sliding_window
        )

    return through_op
