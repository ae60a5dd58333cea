"""The training corpus: the Python standard library's own .py source.

Owns which files are read, how they split into train / validation / held-out, and the counts
that TRAINING.md records. It never tokenizes and never touches a model.

The split is a pure function of each file's path relative to the stdlib root, so the same
Python version gives the same split on every machine.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

HELDOUT_PER_MILLE = 30  # buckets [0, 30) of 1000: held out, reported once at the end
VAL_PER_MILLE = 20  # buckets [30, 50): validation, used only to pick the checkpoint

# Test suites are left out on purpose: distributions ship them as separate packages (Debian and
# Ubuntu put Lib/test in libpython3.X-testsuite), so including them would make the corpus depend
# on how Python was packaged rather than on its version; and they are full of deliberately odd
# fixtures (bad syntax, huge literal tables) that are not the code a demo should imitate.
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
NOT_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})

SPLITS = ("train", "val", "heldout")


@dataclass(frozen=True, slots=True)
class SourceFile:
    relpath: str  # POSIX path relative to the stdlib root, the key of the split
    text: str

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))


@dataclass(slots=True)
class Corpus:
    root: str
    python_version: str
    files: dict[str, list[SourceFile]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    skipped_not_utf8: list[str] = field(default_factory=list)
    skipped_tests: int = 0  # .py files under a TEST_DIRS folder

    def n_files(self, split: str) -> int:
        return len(self.files[split])

    def n_bytes(self, split: str) -> int:
        return sum(f.n_bytes for f in self.files[split])


def stdlib_root() -> Path:
    """The stdlib folder of the interpreter running this script (a venv's base, not the venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> str:
    """Which split a file belongs to, from a SHA-256 of its relative path."""
    bucket = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16) % 1000
    if bucket < HELDOUT_PER_MILLE:
        return "heldout"
    if bucket < HELDOUT_PER_MILLE + VAL_PER_MILLE:
        return "val"
    return "train"


def load_corpus(root: Path | None = None) -> Corpus:
    """Read every .py file under the stdlib root, sorted by path, skipping non-UTF-8 ones."""
    root = root or stdlib_root()
    version = ".".join(str(p) for p in sys.version_info[:3])
    corpus = Corpus(root=str(root), python_version=version)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        folders = set(rel.parts[:-1])
        if path.is_symlink() or NOT_STDLIB_DIRS & folders:
            continue  # installed packages, and distro shims such as a symlinked sitecustomize.py
        if TEST_DIRS & folders:
            corpus.skipped_tests += 1
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            corpus.skipped_not_utf8.append(rel.as_posix())
            continue
        if text.strip():
            corpus.files[split_of(rel.as_posix())].append(SourceFile(rel.as_posix(), text))
    return corpus
