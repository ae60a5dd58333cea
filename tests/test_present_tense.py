"""Code speaks in the present: the comments and docstrings of every Python file, and
config.yaml, say what a thing does and why, never when it was measured or who asked for it.

Owns the check and its four rules; it reads files and never writes one. A line fails on:
- a date (year-month-day);
- an issue of this project (the word issue and its number, or a number of two digits or more
  after a bare "#", so that a label like "run #2" passes; an upstream issue is written with its
  repository, owner/repo#NUMBER, or as a URL);
- a commit id (7 to 40 lowercase hex characters with at least one digit and one letter);
- a measured figure beside a GPU name (a GPU or architecture name on a line, and a number
  with a unit on it or on a neighbouring line of the same comment or docstring).
History is git's and figures live in docs/benchmarks.md. For the rare real need, a line
carries the marker `present-tense: allow` on itself or on the line above.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "present-tense: allow"
# Folders that are not the project's code when the tree is walked without git.
NOT_OURS = {".git", ".venv", "artifacts", "models", "__pycache__", "node_modules", ".whl",
            ".gl", ".carry", ".pytest_cache", ".ruff_cache"}

DATE = re.compile(r"(?<!\d)(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)")
ISSUE = re.compile(r"\bissues?\s+#?\d+\b|(?<![\w./#-])#\d{2,}\b", re.IGNORECASE)
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?!\w)")
GPU = re.compile(r"\b(?:[HBA]100|H200|H800|GH200|GB200|B200|A10G?|A40|L40S?|V100|T4|"
                 r"MI[23]\d0X?|RTX ?\d{4}\w*|Hopper|Ampere|Blackwell)\b")
FIGURE = re.compile(r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:(?:ns|us|µs|μs|ms|s|sec|seconds|min|"
                    r"minutes|[KMGT]i?B(?:/s)?|tok/s|tokens/s|W|[MG]Hz)\b|%)"
                    r"|\d(?:\.\d+)?[x×](?!\w)")


@dataclass(frozen=True, slots=True)
class Prose:
    """One line of a comment or a docstring. Lines of one comment run, one docstring or one
    YAML file share a block (a figure is looked for on neighbouring lines of the block)."""

    line: int
    text: str
    block: int


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.text.strip()}"


def python_prose(source: str) -> list[Prose]:
    """The comments and docstrings of a Python source, line by line. A docstring is a logical
    line made of string literals only (a module's, a class's, a function's or an attribute's)."""
    out: list[Prose] = []
    block, last_comment_row = 0, -2
    logical: list[tokenize.TokenInfo] = []
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = tok.line.lstrip().startswith("#")
            if not alone or tok.start[0] != last_comment_row + 1:
                block += 1  # a comment after code starts a block; one on its own line goes on
            last_comment_row = tok.start[0]
            out.append(Prose(tok.start[0], tok.string.lstrip("#").strip(), block))
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if logical and all(t.type == tokenize.STRING for t in logical):
                block += 1
                for t in logical:
                    out.extend(Prose(t.start[0] + i, text, block)
                               for i, text in enumerate(t.string.split("\n")))
            logical = []
        elif tok.type not in skip:
            logical.append(tok)
    return out


def yaml_prose(source: str) -> list[Prose]:
    """Every line of a YAML file: its keys and values are read as closely as its comments."""
    return [Prose(i, text, 0) for i, text in enumerate(source.splitlines(), start=1)]


def findings(path: str, source: str, prose: list[Prose]) -> list[Finding]:
    """What breaks the rules in these lines, less the lines the marker allows."""
    lines = source.splitlines()

    def allowed(n: int) -> bool:
        return any(MARKER in lines[i - 1] for i in (n, n - 1) if 0 < i <= len(lines))

    found: list[Finding] = []
    for i, p in enumerate(prose):
        if allowed(p.line):
            continue
        for rule, pattern in (("date", DATE), ("issue number", ISSUE), ("commit id", COMMIT)):
            if pattern.search(p.text):
                found.append(Finding(path, p.line, rule, p.text))
        if GPU.search(p.text):
            near = [q for q in prose[max(0, i - 1):i + 2]
                    if q.block == p.block and abs(q.line - p.line) <= 1]
            if any(FIGURE.search(q.text) for q in near):
                found.append(Finding(path, p.line, "figure with a GPU name", p.text))
    return found


def check_file(path: Path) -> list[Finding]:
    source = path.read_text(encoding="utf-8")
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    prose = yaml_prose(source) if path.suffix in (".yaml", ".yml") else python_prose(source)
    return findings(name, source, prose)


def checked_files() -> list[Path]:
    """Every Python file of the project (tracked or new, not ignored) and config.yaml."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py",
             "config.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=60,
            check=True).stdout.splitlines()
        paths = {ROOT / p for p in listed}
    except (OSError, subprocess.SubprocessError):  # a copy of the tree without git
        paths = {p for p in ROOT.rglob("*.py")
                 if not NOT_OURS & set(p.relative_to(ROOT).parts)}
        paths.add(ROOT / "config.yaml")
    return sorted(p for p in paths if p.is_file())


SAMPLE = '''"""Engine start.

Measured on an H200:
the step takes 763 us.
"""
import x  # see issue 22 for why
y = 0xdeadbeef12  # a mask; c6fe613 was the last commit to change it
# fixed on 2026-12-04, see #35
z = "2026-12-04 e105790 issue 7"  # a plain string is code, not prose; "async #2" is a label
# Written in 2026-12 (a month, not a date), for an H200, with no figure.
w = 1  # upstream: pytorch/pytorch#192021; 8 MB of L2 on a Hopper
'''


def test_each_rule_fails_its_line_and_code_is_not_read() -> None:
    got = {(f.line, f.rule) for f in findings("sample.py", SAMPLE, python_prose(SAMPLE))}
    assert got == {(3, "figure with a GPU name"), (6, "issue number"), (7, "commit id"),
                   (8, "date"), (8, "issue number"), (11, "figure with a GPU name")}


def test_the_marker_allows_its_line_and_the_next() -> None:
    source = SAMPLE.replace("import x  # see", "# present-tense: allow\nimport x  # see")
    rules = {f.rule for f in findings("sample.py", source, python_prose(source))
             if f.line in (7, 8)}
    assert rules == {"commit id"}  # the issue line (now 7) is allowed; the commit line is not


def test_config_yaml_is_read_line_by_line() -> None:
    source = ("pdl_overlap: prefetch   # when the next kernel may launch\n"
              "                        # measured on an H200: 763 us at 4bcfee0\n")
    got = {(f.line, f.rule) for f in findings("config.yaml", source, yaml_prose(source))}
    assert got == {(2, "figure with a GPU name"), (2, "commit id")}


def test_the_tree_speaks_in_the_present() -> None:
    """Every comment and docstring of the project, and config.yaml: the failure lists each
    offending file:line with its rule."""
    found = [f for path in checked_files() for f in check_file(path)]
    for f in found:
        print(f)
    files = sorted({f.path for f in found})
    assert not found, (f"{len(found)} lines in {len(files)} files speak of dates, issues, "
                       f"commits or measured GPU figures (or mark `{MARKER}`):\n"
                       + "\n".join(str(f) for f in found))
