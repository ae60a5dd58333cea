"""Telemetry recordings: the engine's JSON-lines export read back, labelled and listed.

A recording is what telemetry/export.py writes (one ``{"type": "step", ...}`` or ``{"type":
"event", ...}`` object per line, spans nested), optionally led by one ``{"type": "meta",
...}`` line that says where it was made (machine, date, commit, model, workload;
`python -m bench record-timeline` writes it). Owns parsing such a file back into StepRecords and
RequestEvents, listing the shipped recordings (docs/recordings/), and splitting a recording
into one window per mode for the A/B view. Pure functions: no streamlit, no engine.

It must never execute or trust anything in a file beyond plain values (json only), and
never write one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.kernels import sample_from_dict
from telemetry.records import RequestEvent, Span, StepRecord, SyncFallback

RECORDINGS_DIR = Path(__file__).resolve().parents[2] / "docs" / "recordings"
SUFFIX = ".jsonl"
_STEP_FIELDS = set(StepRecord.__dataclass_fields__) - {"spans"}
_EVENT_FIELDS = set(RequestEvent.__dataclass_fields__)


@dataclass(slots=True)
class Recording:
    """A recording's steps (in file order), request events and its label."""

    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    events: list[RequestEvent] = field(default_factory=list)

    def title(self) -> str:
        """Machine, date, workload and commit in one line, each where the recording has it."""
        m = self.meta
        parts = [str(m[k]) for k in ("machine", "date", "workload") if m.get(k)]
        if m.get("commit"):
            parts.append(f"commit {m['commit']}")
        return " · ".join(parts) or self.name

    def modes(self) -> list[str]:
        """The mode labels in the order they first appear (see mode_key)."""
        seen: dict[str, None] = {}
        for rec in self.steps:
            seen.setdefault(self.mode_key(rec), None)
        return list(seen)

    def mode_key(self, rec: StepRecord) -> str:
        """A step's window label: the meta's ``windows`` (step ranges) when given, else the
        step's own mode ("sync" / "async", "+graphs" when it ran a CUDA graph)."""
        for w in self.meta.get("windows", []):
            if w.get("first_step", -1) <= rec.step <= w.get("last_step", -1):
                return str(w["label"])
        return rec.mode + ("+graphs" if rec.graph_bucket is not None else "")

    def by_mode(self) -> dict[str, list[StepRecord]]:
        out: dict[str, list[StepRecord]] = {}
        for rec in self.steps:
            out.setdefault(self.mode_key(rec), []).append(rec)
        return out


def _sync_fallback(value: Any) -> SyncFallback:
    try:
        return SyncFallback(value)
    except ValueError:
        allowed = ", ".join(repr(r.value) for r in SyncFallback)
        raise ValueError(f"sync_fallback {value!r} is none of {allowed}") from None


def _step(obj: dict[str, Any], line_no: int) -> StepRecord:
    try:
        spans = [Span(str(s["lane"]), int(s["start_ns"]), int(s["end_ns"])) for s in obj["spans"]]
        facts = {k: obj[k] for k in _STEP_FIELDS if k in obj}
        if facts.get("kernel_samples"):  # the kernel sampler's (telemetry/kernels.py)
            facts["kernel_samples"] = [sample_from_dict(d) for d in facts["kernel_samples"]]
        if facts.get("sync_fallback") is not None:
            facts["sync_fallback"] = _sync_fallback(facts["sync_fallback"])
        return StepRecord(spans=spans, **facts)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"line {line_no}: not a step record ({exc})") from None


def _event(obj: dict[str, Any], line_no: int) -> RequestEvent:
    try:
        return RequestEvent(**{k: obj[k] for k in _EVENT_FIELDS if k in obj})
    except TypeError as exc:
        raise ValueError(f"line {line_no}: not a request event ({exc})") from None


def parse_recording(lines: Iterable[str], name: str = "recording") -> Recording:
    """A Recording from JSON lines; ValueError naming the line when one is not valid."""
    rec = Recording(name=name)
    for i, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}, line {i}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}, line {i}: expected a JSON object")
        kind = obj.pop("type", None)
        if kind == "step":
            rec.steps.append(_step(obj, i))
        elif kind == "event":
            rec.events.append(_event(obj, i))
        elif kind == "meta":
            rec.meta.update(obj)
        else:
            raise ValueError(
                f"{name}, line {i}: unknown type {kind!r}; a recording holds 'meta', 'step' "
                "and 'event' lines (telemetry/export.py)"
            )
    if not rec.steps:
        raise ValueError(f"{name}: no step records (is it a telemetry JSON-lines export?)")
    return rec


def load_recording(path: str | Path) -> Recording:
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        return parse_recording(f, name=path.stem)


def list_recordings(folder: Path = RECORDINGS_DIR) -> list[Path]:
    """The recordings in ``folder`` (``*.jsonl``), sorted by name; [] when there is none."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == SUFFIX and p.is_file())


def meta_line(**meta: Any) -> str:
    """The first line of a recording: ``{"type": "meta", ...}``."""
    return json.dumps({"type": "meta", **meta}, sort_keys=True) + "\n"
