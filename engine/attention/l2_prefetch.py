"""Asking L2 for bytes a kernel will read later: `prefetch.global.L2`, fire and forget.

Owns the two prefetches the programmatic-dependent-launch kernels issue before they wait on
the previous kernel: `prefetch_lines` (one PTX prefetch per pointer, no register waits for
it) and `prefetch_kv` (the first KEYS keys of a paged K/V range, one line per row segment).
They only warm L2, which is coherent across the GPU, so asking for a line that the previous
kernel is still writing (this step's K/V row) is harmless: the load after the wait sees the
write. Never used under the Triton interpreter (PTX inline assembly), which runs no PDL.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - torch-only installs never launch these
    triton = tl = None

PREFETCH_KEYS = 256  # keys a program asks L2 for before its PDL wait (USE_PDL 2)
# At most this many K/V bytes asked of L2 by one launch (tokens x kv heads x PREFETCH_KEYS rows
# of K and V), a rule on shapes only, as graph capture needs: a few MB hide the first reads of a
# small model's step, tens of MB evict lines before they are read (docs/benchmarks.md).
KV_PREFETCH_BUDGET = 8 << 20


def kv_prefetch_fits(tokens: int, kv_heads: int, head_dim: int, elem_size: int) -> bool:
    """Whether a launch's K/V prefetch stays within KV_PREFETCH_BUDGET bytes."""
    rows = tokens * kv_heads * PREFETCH_KEYS
    return rows * head_dim * elem_size * 2 <= KV_PREFETCH_BUDGET


if triton is None:
    # Importable without triton (the dashboard's install has none): the kernels that call
    # these are never defined there either.
    prefetch_lines = prefetch_kv = None
else:

    @triton.jit
    def prefetch_lines(ptrs):
        """One `prefetch.global.L2` per element of the pointer block `ptrs`."""
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [ptrs], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def prefetch_kv(bt_row, stride_btb, max_blocks, k_ptr, v_ptr, kvh, key_lo, key_hi,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, KEYS: tl.constexpr):
        """K and V rows of kv head kvh for the keys [key_lo, min(key_hi, key_lo + KEYS)) of a
        block-table row: their block numbers in one load, then every 128-byte line of them."""
        line: tl.constexpr = 1024 // k_ptr.dtype.element_ty.primitive_bitwidth
        LPR: tl.constexpr = (D + line - 1) // line  # lines a row (head_dim is a power of 2)
        NB: tl.constexpr = (KEYS + BLOCK_SIZE - 1) // BLOCK_SIZE
        b = key_lo // BLOCK_SIZE + tl.arange(0, NB)
        ok = (b * BLOCK_SIZE < key_hi) & (b * BLOCK_SIZE < key_lo + KEYS) & (b < max_blocks)
        blk = tl.load(bt_row + b * stride_btb, mask=ok, other=0).to(tl.int64)
        slot = tl.arange(0, BLOCK_SIZE)
        col = tl.arange(0, LPR) * line
        k_off = (blk * stride_kb)[:, None] + (slot * stride_ks + kvh * stride_kh)[None, :]
        v_off = (blk * stride_vb)[:, None] + (slot * stride_vs + kvh * stride_vh)[None, :]
        k_off = tl.where(ok[:, None], k_off, 0)
        v_off = tl.where(ok[:, None], v_off, 0)
        prefetch_lines(k_ptr + k_off[:, :, None] + col[None, None, :])
        prefetch_lines(v_ptr + v_off[:, :, None] + col[None, None, :])
