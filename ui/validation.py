"""Widget values checked by the engine's own rules, before anything is sent.

Owns turning sampling widgets' values into the engine's verdict: ``sampling_error`` runs
engine.config.SamplingParams' own validate() (the same code the engine runs on submit), so a
widget can never accept what the engine would reject, and ``parse_seed`` reads the seed text
box. Pure functions: no streamlit, no engine process.
"""

from __future__ import annotations

from typing import Any

from engine.config import SamplingParams


def sampling_error(params: dict[str, Any]) -> str | None:
    """The engine's message for ``params`` (SamplingParams keys), or None when valid."""
    try:
        SamplingParams.coerce(dict(params)).validate()
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def parse_seed(text: str) -> tuple[int | None, str | None]:
    """``(seed, error)`` from the seed box: blank is no seed; otherwise a whole number >= 0."""
    text = text.strip()
    if not text:
        return None, None
    try:
        seed = int(text)
    except ValueError:
        return None, f"seed must be a whole number >= 0 (or blank for none), got {text!r}"
    error = sampling_error({"seed": seed})
    return (None, error) if error else (seed, None)
