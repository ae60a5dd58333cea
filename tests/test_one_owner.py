"""One owner per concept: a second definition of a shared rule anywhere in the product fails.

Owns the check for three concepts whose copies would disagree on screen:
- a kernel's family and its colour (owner telemetry/kernel_family.py): a regex that tells
  kernel names apart, a function named for classifying kernels, a literal list of families
  or a dict from family to colour;
- idle time by cause (owner telemetry/gaps.py): a function that attributes idle time, a
  table of causes, or a literal that maps a cause to the lanes that stand for it;
- the A/B verdict with its 95% interval (owner telemetry/verdict.py): the verdict's words
  ("no measurable difference", "not settled"), the interval's quantiles (1.96, a t table,
  the 2.5 and 97.5 percentiles, a ``ppf``) or a "negligible" threshold.
The product is engine/, telemetry/, ui/, bench/ (its old results left out), app.py and
scripts/; docstrings are prose and are not read. It reads files and never writes one; its own
samples show that each rule can fail.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("engine", "telemetry", "ui", "bench", "app.py", "scripts")
NOT_PRODUCT = ("bench/results/",)

KERNEL_FAMILY = "telemetry/kernel_family.py"
IDLE_BY_CAUSE = "telemetry/gaps.py"
VERDICT = "telemetry/verdict.py"

FAMILY_NAMES = {"gemm", "attention", "norm", "rotary", "elementwise", "sampling", "copies"}
# Words of kernel names: two of them as alternatives of one pattern tell kernels apart.
KERNEL_WORDS = ("gemm", "nvjet", "cutlass", "cublas", "xmma", "attn", "fmha", "flash", "rms",
                "memcpy", "memset", "topk", "argmax", "multinomial", "rotary", "rope", "silu",
                "elementwise")
COLOUR = re.compile(r"^(#[0-9a-fA-F]{3,8}|rgba?\(.*\))$")
CLASSIFIER_NAME = re.compile(r"^(kernel_)?family(_of)?$|^classify")
LANES = {"cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.wait", "cpu.post", "h2d", "d2h",
         "compute", "compute.launch"}
CAUSE_FUNCTION = re.compile(r"idle_by_cause|gap_causes?|attribut")
CAUSE_TABLE = re.compile(r"(^|_)CAUSES?$")
VERDICT_WORDS = re.compile(r"no measurable difference|not settled", re.IGNORECASE)
QUANTILES = {1.96, 12.706}


@dataclass(frozen=True, slots=True)
class Definition:
    path: str
    line: int
    concept: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.concept}: {self.what}"


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements (prose)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            out.add(id(node.value))
    return out


def strings_of(node: ast.AST) -> list[str]:
    """The string constants that are a literal's elements, or its elements' first items."""
    out = []
    for elt in getattr(node, "elts", []):
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
            out.append(elt.value)
        elif isinstance(elt, ast.Tuple) and elt.elts and isinstance(elt.elts[0], ast.Constant) \
                and isinstance(elt.elts[0].value, str):
            out.append(elt.elts[0].value)
    return out


def lane_strings(node: ast.AST) -> list[str]:
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return []
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in LANES]


def kernel_family_definitions(tree: ast.AST, prose: set[int]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and CLASSIFIER_NAME.search(node.name):
            found.append((node.lineno, f"function {node.name}() classifies kernels"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in prose and "|" in node.value:
            parts = [p.lower() for p in node.value.split("|")]
            words = {w for w in KERNEL_WORDS if any(w in p for p in parts)}
            if len(words) >= 2:
                found.append((node.lineno, f"a pattern over kernel names ({node.value[:50]!r})"))
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            colours = [v for v in node.values if isinstance(v, ast.Constant)
                       and isinstance(v.value, str) and COLOUR.match(v.value)]
            if len(FAMILY_NAMES.intersection(keys)) >= 3 and len(colours) >= 3:
                found.append((node.lineno, "a colour for each kernel family"))
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            if len(FAMILY_NAMES.intersection(strings_of(node))) >= 4:
                found.append((node.lineno, "a list of kernel families"))
    return found


def idle_cause_definitions(tree: ast.AST, prose: set[int]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and CAUSE_FUNCTION.search(node.name):
            found.append((node.lineno, f"function {node.name}() attributes idle time"))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and CAUSE_TABLE.search(t.id):
                    found.append((node.lineno, f"a table of idle causes ({t.id})"))
        elif isinstance(node, ast.Dict):
            if sum(bool(lane_strings(v)) for v in node.values) >= 2:
                found.append((node.lineno, "causes mapped to the lanes that stand for them"))
        elif isinstance(node, ast.Tuple | ast.List):
            pairs = [e for e in node.elts if isinstance(e, ast.Tuple) and len(e.elts) == 2
                     and isinstance(e.elts[0], ast.Constant) and lane_strings(e.elts[1])]
            if len(pairs) >= 2:
                found.append((node.lineno, "causes mapped to the lanes that stand for them"))
    return found


def verdict_definitions(tree: ast.AST, prose: set[int]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in prose and VERDICT_WORDS.search(node.value):
            found.append((node.lineno, f"the verdict's words ({node.value.strip()[:50]!r})"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, float) \
                and node.value in QUANTILES:
            found.append((node.lineno, f"a 95% quantile ({node.value})"))
        elif isinstance(node, ast.Attribute) and node.attr == "ppf":
            found.append((node.lineno, "a distribution's quantile (ppf)"))
        elif isinstance(node, ast.Call):
            floats = {a.value for a in ast.walk(node) if isinstance(a, ast.Constant)}
            if {2.5, 97.5} <= floats:
                found.append((node.lineno, "the 2.5 and 97.5 percentiles"))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and ("NEGLIGIBLE" in t.id or t.id == "T95"):
                    found.append((node.lineno, f"a verdict threshold ({t.id})"))
    return found


RULES = (
    ("kernel family", KERNEL_FAMILY, kernel_family_definitions),
    ("idle by cause", IDLE_BY_CAUSE, idle_cause_definitions),
    ("A/B verdict", VERDICT, verdict_definitions),
)


def definitions(source: str, path: str) -> list[Definition]:
    """Every definition of a concept in ``source`` outside that concept's owner."""
    tree = ast.parse(source)
    prose = docstring_nodes(tree)
    out = []
    for concept, owner, find in RULES:
        if path != owner:
            out += [Definition(path, line, concept, what) for line, what in find(tree, prose)]
    return out


def product_files() -> list[Path]:
    files: list[Path] = []
    for part in PRODUCT:
        p = ROOT / part
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.exists() else [])
    return [f for f in files if not any(n in f.relative_to(ROOT).as_posix() for n in NOT_PRODUCT)]


def test_each_concept_is_defined_by_its_owner_only():
    found = []
    for path in product_files():
        found += definitions(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not found, ("second definitions (import the owner instead):\n"
                       + "\n".join(map(str, found)))


@pytest.mark.parametrize(("concept", "owner", "find"), RULES)
def test_each_owner_holds_its_definition(concept, owner, find):
    """The owner defines the concept (so a moved owner cannot leave this test blind)."""
    path = ROOT / owner
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert find(tree, docstring_nodes(tree)), f"{owner} no longer defines the {concept}"


SECOND_DEFINITIONS = {
    "kernel family": [
        'PATTERN = re.compile(r"gemm|cublas|nvjet")',
        "def family_of(name):\n    return 'other'",
        'COLOURS = {"gemm": "#111111", "attention": "#222222", "norm": "#333333"}',
        'ORDER = ("gemm", "attention", "norm", "rotary", "copies")',
    ],
    "idle by cause": [
        "def idle_by_cause(spans, lo, hi):\n    return {}",
        'IDLE_CAUSES = ()',
        'WHO = (("CPU", ("cpu.prepare", "cpu.launch")), ("copies", ("h2d", "d2h")))',
        'WHO = {"CPU": ("cpu.prepare",), "copies": ("h2d", "d2h")}',
    ],
    "A/B verdict": [
        'def say(x):\n    return f"{x}: no measurable difference"',
        "half = 1.96 * sd",
        "lo, hi = np.percentile(diffs, [2.5, 97.5])",
        "q = scipy.stats.t.ppf(0.975, df)",
        "NEGLIGIBLE_PCT = 2.0",
    ],
}


@pytest.mark.parametrize(("concept", "source"),
                         [(c, s) for c, ss in SECOND_DEFINITIONS.items() for s in ss])
def test_a_second_definition_is_found(concept, source):
    assert [d.concept for d in definitions(source, "ui/sample.py")] == [concept]


def test_docstrings_and_the_owner_itself_are_not_findings():
    doc = '"""Says "no measurable difference" and gemm|attn in prose."""\n'
    assert definitions(doc, "ui/sample.py") == []
    assert definitions('NEGLIGIBLE_PCT = 2.0', VERDICT) == []
