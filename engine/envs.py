"""The environment variables gapless reads: one registry, each with its meaning and its parser.

Owns their names, what each means, and parsing a value (a bad one is a ValueError that names
the variable and what it allows). Readers take a value from here (`envs.get(envs.GAPLESS_CACHE)`)
and never read os.environ for a GAPLESS_* name themselves; a process that starts another names
the variable by the constant here. Only deployment settings and process plumbing are
environment variables: what changes how the engine computes is a config key (config.yaml),
validated there. Imports nothing of ours and no torch (the dashboard reads it too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One variable: what it means, how its text becomes a value, the value when unset."""

    name: str
    meaning: str
    parse: Callable[[str, str], Any]
    default: Any = None


def _text(name: str, value: str) -> str:
    return value


def _path(name: str, value: str) -> Path:
    return Path(value).expanduser()


def _switch(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name} must be 1 or 0 (true/false, on/off, yes/no), got {value!r}")


GAPLESS_CONFIG = "GAPLESS_CONFIG"
GAPLESS_API_KEY = "GAPLESS_API_KEY"
GAPLESS_ENGINE_SOCKET = "GAPLESS_ENGINE_SOCKET"
GAPLESS_ENGINE_FORKSERVER = "GAPLESS_ENGINE_FORKSERVER"
GAPLESS_CACHE = "GAPLESS_CACHE"

ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar(GAPLESS_CONFIG, "the settings file the dashboard starts its engine with",
           _path, Path("config.yaml")),
    EnvVar(GAPLESS_API_KEY, "the key `python -m engine serve` requires of HTTP clients when "
           "--api-key is not given (a variable keeps it out of `ps`); unset: no key",
           _text),
    EnvVar(GAPLESS_ENGINE_SOCKET, "the socket of a running engine process (`python -m engine "
           "serve` prints it) that the dashboard attaches to instead of starting its own",
           _path),
    EnvVar(GAPLESS_ENGINE_FORKSERVER, "0: start every CPU engine process fresh instead of "
           "forking it from the fork server", _switch, True),
    EnvVar(GAPLESS_CACHE, "the folder of gapless's on-disk caches (the measured bandwidth "
           "curve of this GPU)", _path, Path.home() / ".cache" / "gapless"),
)}


def get(name: str) -> Any:
    """The value of the variable `name` in this process (its default when unset or empty);
    ValueError for a name not in the registry or a value its parser refuses."""
    var = ENV_VARS.get(name)
    if var is None:
        raise ValueError(f"{name!r} is not an environment variable of gapless; known: "
                         f"{', '.join(ENV_VARS)}")
    value = os.environ.get(name, "")
    return var.parse(name, value) if value else var.default


def describe() -> str:
    """One line per variable: name, meaning and default (for --help texts and the docs)."""
    return "\n".join(f"{v.name}: {v.meaning}" + ("" if v.default is None else
                                                  f" (default: {v.default})")
                     for v in ENV_VARS.values())
