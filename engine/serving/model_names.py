"""The names a served model answers to: its hub id where known, else its folder's last part.

Owns what `/v1/models` lists and which `model` values a request may send. As vLLM does, the
served names default to the model's Hugging Face hub id, so a benchmark client with hub
access (GuideLLM, vLLM's own bench) loads the right tokenizer by that name: a hub id given
as the model is its own name; a local folder names its hub id in ``hub_id.txt`` (written by
scripts/fetch_default_model.py for the default model); any other folder is served under its
last path component. ``--served-model-name a b`` replaces them with aliases, the first of
which answers in responses and labels the metrics. The model as configured (the folder path
or hub id config.yaml gives) is accepted in requests too, unlisted. Never loads a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

HUB_ID_FILE = "hub_id.txt"


def default_name(model: str) -> str:
    """The name a model (a folder path or a hub id) is served under by default."""
    path = Path(model).expanduser()
    if path.is_dir():
        hub_id = path / HUB_ID_FILE
        if hub_id.is_file():
            text = hub_id.read_text(encoding="utf-8").strip()
            if text:
                return text
        return path.resolve().name
    return model  # a hub id (or a name the engine resolved): clients already know it


def served_names(model: str, given: str | Sequence[str] | None = None) -> list[str]:
    """The served names, first one first: ``given`` (one or several aliases, duplicates
    dropped) or the default. ValueError for an empty alias."""
    if given is None or (not isinstance(given, str) and len(given) == 0):
        return [default_name(model)]
    names = [given] if isinstance(given, str) else list(given)
    for name in names:
        if not name.strip():
            raise ValueError("--served-model-name: an alias may not be empty")
    return list(dict.fromkeys(names))


def accepted_names(model: str, names: Sequence[str]) -> set[str]:
    """Every ``model`` value a request may send: the served names and the model as
    configured (the string given, and a folder's absolute path)."""
    out = set(names) | {model}
    path = Path(model).expanduser()
    if path.is_dir():
        out.add(str(path.resolve()))
    return out
