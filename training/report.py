"""What a training run records: greedy completions and the model folder's TRAINING.md.

Owns the run record (also written as JSON) and its Markdown rendering. It never trains.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:", "    for i in range(")


@dataclass(slots=True)
class RunRecord:
    command: str
    date_utc: str
    device: str
    software: str
    python_version: str
    stdlib_root: str
    settings: dict[str, object]
    n_params: int
    files: dict[str, int]
    n_bytes: dict[str, int]
    n_tokens: dict[str, int]
    skipped_not_utf8: list[str]
    skipped_tests: int
    steps: int = 0
    tokens_seen: int = 0
    epochs: float = 0.0
    final_train_loss: float = 0.0  # mean of the last steps' batch losses (bf16 autocast)
    train_eval_nats: float = 0.0  # shipped weights, same method as held-out, 1/33 of train files
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    best_step: int = 0
    heldout_nats: float = 0.0
    heldout_bits_per_byte: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    completions: list[tuple[str, str]] = field(default_factory=list)

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")


@torch.no_grad()
def greedy_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, max_new_tokens: int
) -> list[tuple[str, str]]:
    device = next(model.parameters()).device
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        gen = model.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append((prompt, tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)))
    return out


def render_markdown(r: RunRecord) -> str:
    s = r.settings
    split_rows = "\n".join(
        f"| {k} | {r.files[k]} | {r.n_bytes[k]:,} | {r.n_tokens[k]:,} |" for k in r.files
    )
    curve = ", ".join(f"{step}: {loss:.4f}" for step, loss in r.val_curve)
    comps = "\n\n".join(f"Prompt `{p!r}` →\n\n```python\n{p}{c}\n```" for p, c in r.completions)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in r.seconds.items())
    return f"""# gapless-tiny-python

A {r.n_params / 1e6:.2f}M-parameter Llama-architecture model with a byte-level BPE tokenizer,
trained from scratch on the Python standard library's own source, so the CPU demo answers with
real (if small-minded) Python. Written by `training/train.py`; regenerate, don't hand-edit.

## Data

- Python {r.python_version}, stdlib root `{r.stdlib_root}`: every `.py` file, sorted by path.
- Left out: the test suites (folders named `test`, `tests`, `idle_test`: {r.skipped_tests} files),
  because distributions package them separately, so including them would tie the corpus to the
  packaging rather than the version; installed packages (`site-packages`, `dist-packages`);
  symlinked files; files that are not UTF-8 ({len(r.skipped_not_utf8)}: {r.skipped_not_utf8}).
- Split: bucket = int(sha256(path relative to the stdlib root)[:8], 16) % 1000; buckets 0-29
  held out (reported once, below), 30-49 validation (only picks the checkpoint), rest train.
  The tokenizer is trained on the train split only.

| split | files | bytes | tokens (EOT before each file included) |
| --- | ---: | ---: | ---: |
{split_rows}

## Model and training

- LlamaForCausalLM, {r.n_params:,} parameters, stored in bf16: vocab {s["vocab_size"]},
  hidden {s["hidden_size"]}, SwiGLU intermediate {s["intermediate_size"]}, {s["num_layers"]} layers,
  {s["num_heads"]} query heads and {s["num_kv_heads"]} key/value heads (GQA), head dim
  {s["hidden_size"] // s["num_heads"]}, RoPE, context {s["seq_len"]}, tied embeddings.
- Tokenizer: byte-level BPE (`tokenizers`), `<|endoftext|>` = id 0 is bos, eos and pad; it
  separates files in training. No normalizer, no prefix space: decoding round-trips exactly.
- Settings: `{json.dumps(s)}`
- AdamW (betas 0.9/0.95, weight decay on matrices only), bf16 autocast, fp32 master weights,
  linear warmup then cosine, dropout {s["dropout"]} on embeddings and residual branches (training
  only, by forward hooks: the saved model is plain Llama); batches of {s["batch_size"]} random
  windows of {s["seq_len"]} tokens.
  The step count is fixed after timing the first steps so the loop fits its wall budget.
  Eager PyTorch: the run is bound by data (epochs below), not compute, so torch.compile's
  compile time and risk buy nothing here.
- Steps {r.steps}, tokens seen {r.tokens_seen:,} ({r.epochs:.1f} epochs of the train split).
- Validation loss (nats/token) by step: {curve}.
- Shipped checkpoint: step {r.best_step}, the lowest validation loss.

## Results (shipped bf16 weights, evaluated in fp32)

| measure | value |
| --- | ---: |
| final train loss (mean of last batches, nats/token) | {r.final_train_loss:.4f} |
| train loss, 1/33 of train files, same method as held-out | {r.train_eval_nats:.4f} |
| held-out loss (nats/token) | {r.heldout_nats:.4f} |
| held-out bits/byte | {r.heldout_bits_per_byte:.4f} |

Held-out loss is the mean NLL of every token of the held-out stream (files each preceded by
EOT) in non-overlapping {s["seq_len"]}-token windows; bits/byte divides the summed NLL by ln 2
and by the files' UTF-8 bytes.

## Run

- Command: `{r.command}`
- Device: {r.device}; {r.software}
- Date (UTC): {r.date_utc}
- Wall time: {phases}

## Greedy completions (`model.generate`, do_sample=False, 48 new tokens, fp32)

{comps}
"""
