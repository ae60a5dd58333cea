"""Token streams for training and evaluation.

Owns turning files into one flat token stream (each file preceded by EOT, as the model sees
documents), drawing random training windows from it, and the exact NLL sum over a stream.
It never decides the model or the schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from training.corpus import SourceFile


@dataclass(frozen=True, slots=True)
class TokenStream:
    ids: torch.Tensor  # int64, 1-D: EOT file EOT file ...
    n_bytes: int  # UTF-8 bytes of the files' text, the denominator of bits/byte


@dataclass(frozen=True, slots=True)
class EvalResult:
    nats_per_token: float
    bits_per_byte: float
    n_tokens: int


def build_stream(files: list[SourceFile], tokenizer: PreTrainedTokenizerFast) -> TokenStream:
    eot = tokenizer.eos_token_id
    encodings = tokenizer.backend_tokenizer.encode_batch(
        [f.text for f in files], add_special_tokens=False
    )
    ids: list[int] = []
    for enc in encodings:
        ids.append(eot)
        ids.extend(enc.ids)
    return TokenStream(torch.tensor(ids, dtype=torch.long), sum(f.n_bytes for f in files))


def sample_batch(
    stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of seq_len + 1 tokens of `stream`, as (inputs, targets)."""
    high = stream.numel() - seq_len - 1
    starts = torch.randint(0, high, (batch, 1), generator=gen, device=stream.device)
    idx = starts + torch.arange(seq_len + 1, device=stream.device)
    windows = stream[idx]
    return windows[:, :-1], windows[:, 1:]


def _nll_sum(model: PreTrainedModel, windows: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast(windows.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=windows[:, :-1], use_cache=False).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1), windows[:, 1:].flatten(), reduction="sum"
    ).double()


@torch.no_grad()
def evaluate(
    model: PreTrainedModel, stream: TokenStream, seq_len: int, batch: int, autocast: bool
) -> EvalResult:
    """Exact mean NLL over every token of the stream after the first, in non-overlapping windows."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = stream.ids.to(device)
    n_targets = ids.numel() - 1
    n_full = n_targets // seq_len
    offsets = torch.arange(seq_len + 1, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for first in range(0, n_full, batch):
        starts = torch.arange(first, min(first + batch, n_full), device=device) * seq_len
        total += _nll_sum(model, ids[starts[:, None] + offsets], autocast)
    if n_full * seq_len < n_targets:
        total += _nll_sum(model, ids[None, n_full * seq_len :], autocast)
    model.train(was_training)
    nats = total.item()
    return EvalResult(nats / n_targets, nats / math.log(2) / stream.n_bytes, n_targets)
