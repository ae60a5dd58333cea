"""Settings of a training run and the model architecture they imply.

Owns the two presets (the shipped model and the CPU smoke run) and the learning-rate schedule,
both pure so they test without a GPU. Every knob lives here, none is implied by another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import LlamaConfig


@dataclass(frozen=True, slots=True)
class Settings:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # fewer than num_heads: grouped-query attention
    seq_len: int
    batch_size: int
    peak_lr: float
    min_lr_ratio: float  # cosine decays to peak_lr * min_lr_ratio
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    dropout: float  # on embeddings and residual branches, training only (the data is small)
    train_seconds: float  # wall budget of the loop; steps are fixed once speed is measured
    calibrate_steps: tuple[int, int]  # speed is first timed between these steps
    max_steps: int
    n_evals: int  # validation evaluations over the run; the best one is the shipped checkpoint
    file_stride: int  # use every file_stride-th file of each split (1: all)
    seed: int = 0


FULL = Settings(
    vocab_size=8192,
    hidden_size=384,
    intermediate_size=768,
    num_layers=6,
    num_heads=6,
    num_kv_heads=2,
    seq_len=1024,
    batch_size=32,
    peak_lr=2e-3,
    min_lr_ratio=0.1,
    warmup_steps=200,
    weight_decay=0.1,
    grad_clip=1.0,
    dropout=0.1,
    train_seconds=330.0,
    # Late enough that CUDA warm-up and the start of sibling runs (training/run_on_gpu.sh runs
    # several side by side on one GPU) are over.
    calibrate_steps=(300, 600),
    max_steps=1_000_000,
    n_evals=12,
    file_stride=1,
)

SMOKE = Settings(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    seq_len=64,
    batch_size=4,
    peak_lr=2e-3,
    min_lr_ratio=0.1,
    warmup_steps=4,
    weight_decay=0.1,
    grad_clip=1.0,
    dropout=0.1,
    train_seconds=8.0,
    calibrate_steps=(5, 15),
    max_steps=1000,
    n_evals=3,
    file_stride=25,
)


def model_config(s: Settings, eot_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.hidden_size // s.num_heads,
        max_position_embeddings=s.seq_len,  # trained at this length only; beyond it is untested
        tie_word_embeddings=True,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )


def lr_at(step: int, total_steps: int, s: Settings) -> float:
    """Linear warmup to peak_lr, then cosine down to peak_lr * min_lr_ratio at total_steps."""
    if step < s.warmup_steps:
        return s.peak_lr * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, total_steps - s.warmup_steps))
    floor = s.peak_lr * s.min_lr_ratio
    return floor + (s.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
