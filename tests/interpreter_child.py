"""One TRITON_INTERPRET=1 pytest child for every kernel test file's ``test_interp_*`` tests.

Triton reads TRITON_INTERPRET when a kernel is defined (at import), so the kernel tests run
their ``test_interp_*`` cases in a child process with the variable set, and one parent test a
file asserts on the outcome. A child per file would each pay a Python that imports torch,
Triton, pytest and the test helpers before its first case; instead the first parent to ask
runs one child over every file in FILES and each parent reads its own file's part: its
cases' outcomes (from the child's junit XML), in the form the parents assert on
(``returncode``, and a pytest summary line in ``stdout``).

tests/conftest.py makes all the parents one xdist unit (PARENTS), so the child runs once a
session, on one worker. A parent run on its own (``pytest file::parent``) still runs the
child over every file (it cannot know which parents will follow); `-k` on the child
selects only ``test_interp_`` cases, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# file -> its parent test; the seconds its own child was allowed (the one child gets the sum).
FILES = {
    "tests/attention/test_paged_attention.py":
        ("test_triton_kernel_matches_reference_in_interpreter_subprocess", 540),
    "tests/model/test_fused_gemm.py": ("test_fused_linear_in_interpreter_subprocess", 600),
    "tests/model/test_fused_ops.py":
        ("test_fused_kernels_match_torch_in_interpreter_subprocess", 540),
    "tests/model/test_fused_rope.py": ("test_qkv_rope_in_interpreter_subprocess", 600),
    "tests/model/test_fused_rope_engine.py": ("test_rope_engine_in_interpreter_subprocess", 600),
}
PARENTS = frozenset(f"{path}::{test}" for path, (test, _) in FILES.items())
UNIT = "tests/interpreter-child"  # the xdist unit of all the parents
BUDGET_S = sum(t for _, t in FILES.values())  # the one child's time limit


@dataclass(frozen=True)
class FileOutcome:
    """One file's part of the child's run, shaped as its own child's was."""

    returncode: int  # 0: every case of the file passed (the child itself ran to its end)
    stdout: str  # the file's pytest summary line, e.g. "3 passed in 12.34s"


_run: dict[str, object] = {}  # the child's run in this process: "cases", "rc", "tail"


def _run_child() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "interp.xml"
        cmd = [sys.executable, "-m", "pytest", *FILES, "-k", "test_interp_", "-q",
               "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={xml}"]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=BUDGET_S)
        except subprocess.TimeoutExpired as e:  # every parent fails with it, none re-runs it
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                else (e.stdout or "")
            proc = subprocess.CompletedProcess(cmd, -9, out + f"\ntimed out after {e.timeout} s",
                                               "")
        cases = []
        if xml.is_file():
            for case in ET.parse(xml).iter("testcase"):
                path = case.get("classname", "").replace(".", "/") + ".py"
                outcome = "passed"
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = {"failure": "failed", "error": "error"}.get(child.tag,
                                                                             "skipped")
                        text = (child.get("message") or "") + "\n" + (child.text or "")
                        cases.append((path, case.get("name"), outcome, text[-3000:]))
                        break
                else:
                    cases.append((path, case.get("name"), outcome, ""))
    _run.update(cases=cases, rc=proc.returncode, seconds=time.monotonic() - t0,
                tail=proc.stdout[-4000:] + proc.stderr[-2000:])


def run_interpreter_child(test_file: str) -> tuple[FileOutcome, str]:
    """``test_file``'s ``test_interp_*`` cases as run by the one interpreter child (started
    on the first call in this process): its outcome and a report for the assertion message."""
    rel = Path(test_file).resolve().relative_to(REPO_ROOT).as_posix()
    assert rel in FILES, f"{rel} is not in tests/interpreter_child.py's FILES"
    if not _run:
        _run_child()
    mine = [c for c in _run["cases"] if c[0] == rel]
    counts = {k: sum(1 for c in mine if c[2] == k) for k in ("failed", "passed", "skipped",
                                                             "error")}
    summary = ", ".join(f"{n} {'errors' if k == 'error' else k}"
                        for k, n in counts.items() if n) or "no tests ran"
    # The child ran to its end (0: all passed, 1: some case failed) or it did not (an
    # internal error, a usage error, no XML): then every file's part fails with its code.
    # No case of the file ran: 5, pytest's "no tests collected", as its own child said.
    rc = (_run["rc"] if _run["rc"] not in (0, 1) or not _run["cases"]
          else 5 if not mine else int(bool(counts["failed"] or counts["error"])))
    outcome = FileOutcome(rc, f"{summary} in {_run['seconds']:.2f}s (one child for "
                              f"{len(FILES)} files)")
    report = "\n".join([f"{rel}: {outcome.stdout}, child exit {_run['rc']}",
                        *(f"{name} {what}:\n{text}" for _, name, what, text in mine
                          if what != "passed"),
                        "child's output (tail):", str(_run["tail"])])
    return outcome, report
