"""Train the default model end to end: corpus, tokenizer, model, evaluation, model folder.

Usage (the shipped model, one GPU, about 7 minutes):
    python -m training.train --out models/gapless-tiny-python --artifacts /tmp/run
CPU pipeline check (seconds, tiny, writes a throwaway folder):
    python -m training.train --smoke --out /tmp/smoke-model --artifacts /tmp/smoke

Owns the training loop and the order of the steps. It never writes outside --out and
--artifacts, and never downloads anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from torch.utils.hooks import RemovableHandle
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

from training.corpus import Corpus, load_corpus
from training.data import TokenStream, build_stream, evaluate, sample_batch
from training.report import RunRecord, greedy_completions, render_markdown
from training.settings import FULL, SMOKE, Settings, lr_at, model_config
from training.tokenizer import train_tokenizer

OVERRUN_SECONDS = 45  # hard stop past the budget, should the GPU slow down after calibration
SNIPPET_BYTES = 3000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def add_residual_dropout(model: LlamaForCausalLM, p: float) -> list[RemovableHandle]:
    """Dropout on the embeddings and on each attention and MLP output, active in train mode.

    Done with forward hooks so the saved model is plain LlamaForCausalLM: nothing to load.
    """

    def drop(module: torch.nn.Module, _args: object, out: object) -> object:
        if isinstance(out, tuple):  # attention returns (output, weights)
            return (F.dropout(out[0], p, module.training), *out[1:])
        return F.dropout(out, p, module.training)

    modules = [model.model.embed_tokens]
    for layer in model.model.layers:
        modules += [layer.self_attn, layer.mlp]
    return [m.register_forward_hook(drop) for m in modules]


def make_optimizer(model: torch.nn.Module, s: Settings, fused: bool) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # RMSNorm gains
    groups = [
        {"params": decay, "weight_decay": s.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=s.peak_lr, betas=(0.9, 0.95), fused=fused)


@dataclass(slots=True)
class Pace:
    """Fixes the step count from measured speed so the loop ends on its wall budget.

    Speed is measured over Settings.calibrate_steps, then again over each evaluation interval
    (evaluations included), since sibling runs on the same GPU finish at other times.
    """

    budget_s: float
    max_steps: int
    t0: float
    total: int = 0
    mark: tuple[int, float] = (0, 0.0)

    def __post_init__(self) -> None:
        self.total = self.max_steps

    def replan(self, step: int, now: float) -> float:
        """Re-fix the step count from the speed since the last mark; return seconds per step."""
        per_step = (now - self.mark[1]) / (step - self.mark[0])
        left = self.budget_s - (now - self.t0)
        self.total = min(self.max_steps, step + max(1, int(left / per_step)))
        self.mark = (step, now)
        return per_step

    def overrun(self, now: float) -> bool:
        return now - self.t0 > self.budget_s + OVERRUN_SECONDS


def train_step(
    model: LlamaForCausalLM,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    s: Settings,
) -> torch.Tensor:
    cuda = x.device.type == "cuda"
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=cuda):
        logits = model(input_ids=x, use_cache=False).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def train_loop(
    model: LlamaForCausalLM, train: TokenStream, val: TokenStream, s: Settings, record: RunRecord
) -> None:
    """Train in place; leaves the best-validation weights loaded and fills `record`."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    opt = make_optimizer(model, s, fused=cuda)
    stream = train.ids.to(device)
    # On the device: a host-side generator would make every step's copy wait for the GPU.
    gen = torch.Generator(device=device).manual_seed(s.seed + 1)
    hooks = add_residual_dropout(model, s.dropout)
    pace = Pace(s.train_seconds, s.max_steps, time.perf_counter())
    eval_every = max(1, s.max_steps // s.n_evals)
    best: tuple[float, int, dict[str, torch.Tensor]] = (math.inf, 0, {})
    recent: list[torch.Tensor] = []  # last batches' losses, kept on the device until the end
    step = 0
    while step < pace.total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, pace.total, s)
        loss = train_step(model, opt, *sample_batch(stream, s.batch_size, s.seq_len, gen), s)
        step += 1
        recent = [*recent[-99:], loss]
        if pace.overrun(time.perf_counter()):
            log(f"stopping at step {step} of {pace.total}: past the wall budget")
            pace.total = step
        cal_from, cal_to = s.calibrate_steps
        if step == cal_from:
            sync()
            pace.mark = (step, time.perf_counter())
        elif step == cal_to or (step > cal_to and step % eval_every == 0):
            sync()
            per_step = pace.replan(step, time.perf_counter())
            if step == cal_to:
                eval_every = max(1, pace.total // s.n_evals)
            log(f"{per_step * 1e3:.1f} ms/step: planning {pace.total} steps")
        if step % eval_every == 0 or step == pace.total:
            v = evaluate(model, val, s.seq_len, s.batch_size, autocast=cuda).nats_per_token
            record.val_curve.append((step, round(v, 4)))
            if v < best[0]:
                best = (v, step, {k: t.clone() for k, t in model.state_dict().items()})
            rate = step * s.batch_size * s.seq_len / (time.perf_counter() - pace.t0)
            log(f"step {step}/{pace.total} loss {loss.item():.4f} val {v:.4f} {rate:,.0f} tok/s")
    for hook in hooks:
        hook.remove()
    model.load_state_dict(best[2])
    record.steps, record.best_step = step, best[1]
    record.tokens_seen = step * s.batch_size * s.seq_len
    record.epochs = round(record.tokens_seen / train.ids.numel(), 2)
    record.final_train_loss = round(torch.stack(recent).mean().item(), 4)


def heldout_snippet(corpus: Corpus) -> str:
    """Leading whole lines, about SNIPPET_BYTES, of the first held-out file big enough."""
    files = corpus.files["heldout"]
    big = [f for f in files if f.n_bytes >= 2 * SNIPPET_BYTES]
    f = big[0] if big else max(files, key=lambda f: f.n_bytes)
    lines, size = [], 0
    for line in f.text.splitlines(keepends=True):
        if size + len(line.encode()) > SNIPPET_BYTES:
            break
        lines.append(line)
        size += len(line.encode())
    return f"# {f.relpath} (Python {corpus.python_version})\n" + "".join(lines)


def run(s: Settings, out: Path, artifacts: Path, command: str) -> RunRecord:
    t_start = time.perf_counter()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(s.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    corpus = load_corpus()
    for split, files in corpus.files.items():
        corpus.files[split] = files[:: s.file_stride]
    log(
        f"corpus: Python {corpus.python_version}, {corpus.root}, "
        f"{ {k: len(v) for k, v in corpus.files.items()} } files"
    )
    tokenizer = train_tokenizer((f.text for f in corpus.files["train"]), s.vocab_size)
    t_tok = time.perf_counter()
    streams = {k: build_stream(v, tokenizer) for k, v in corpus.files.items()}
    log(
        f"tokenizer {t_tok - t_start:.1f} s; tokens { {k: len(v.ids) for k, v in streams.items()} }"
    )
    model = LlamaForCausalLM(model_config(s, tokenizer.eos_token_id)).to(device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    record = RunRecord(
        command=command,
        date_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        device=f"{gpu}, {torch.get_num_threads()} CPU threads",
        software=f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}",
        python_version=corpus.python_version,
        stdlib_root=corpus.root,
        settings=dataclasses.asdict(s),
        n_params=sum(p.numel() for p in model.parameters()),
        files={k: len(v) for k, v in corpus.files.items()},
        n_bytes={k: v.n_bytes for k, v in streams.items()},
        n_tokens={k: v.ids.numel() for k, v in streams.items()},
        skipped_not_utf8=corpus.skipped_not_utf8,
        skipped_tests=corpus.skipped_tests,
    )
    log(f"model: {record.n_params:,} parameters on {device}")
    t_train = time.perf_counter()
    train_loop(model, streams["train"], streams["val"], s, record)
    t_eval = time.perf_counter()

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Everything below measures the folder as shipped: reloaded, bf16 weights upcast to fp32.
    shipped = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device)
    shipped_tok = AutoTokenizer.from_pretrained(out)
    held = evaluate(shipped, streams["heldout"], s.seq_len, s.batch_size, autocast=False)
    train_sample = build_stream(corpus.files["train"][::33], shipped_tok)
    record.train_eval_nats = round(
        evaluate(shipped, train_sample, s.seq_len, s.batch_size, autocast=False).nats_per_token, 4
    )
    record.heldout_nats = round(held.nats_per_token, 4)
    record.heldout_bits_per_byte = round(held.bits_per_byte, 4)
    record.completions = greedy_completions(shipped, shipped_tok, max_new_tokens=48)
    t_end = time.perf_counter()
    record.seconds = {
        "tokenizer": t_tok - t_start,
        "setup": t_train - t_tok,
        "training loop": t_eval - t_train,
        "save, evaluate, generate": t_end - t_eval,
        "total": t_end - t_start,
    }
    (out / "TRAINING.md").write_text(render_markdown(record))
    artifacts.mkdir(parents=True, exist_ok=True)
    record.write_json(artifacts / "record.json")
    (artifacts / "heldout_snippet.py.txt").write_text(heldout_snippet(corpus))
    log(f"held-out {record.heldout_nats} nats/token, {record.heldout_bits_per_byte} bits/byte")
    for prompt, completion in record.completions:
        log(f"{prompt!r} -> {completion!r}")
    return record


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="model folder to write")
    p.add_argument("--artifacts", type=Path, required=True, help="record.json, snippet")
    p.add_argument("--smoke", action="store_true", help="tiny CPU pipeline check")
    p.add_argument("--train-seconds", type=float, help="override the loop's wall budget")
    p.add_argument("--dropout", type=float, help="override the preset's dropout")
    args = p.parse_args(argv)
    s = SMOKE if args.smoke else FULL
    if args.train_seconds is not None:
        if args.train_seconds <= 0:
            p.error(f"--train-seconds must be positive, got {args.train_seconds}")
        s = dataclasses.replace(s, train_seconds=args.train_seconds)
    if args.dropout is not None:
        if not 0.0 <= args.dropout < 1.0:
            p.error(f"--dropout must be in [0, 1), got {args.dropout}")
        s = dataclasses.replace(s, dropout=args.dropout)
    run(s, args.out, args.artifacts, shlex.join(["python", "-m", "training.train", *argv]))


if __name__ == "__main__":
    main()
