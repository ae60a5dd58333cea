"""`python -m bench list` lists suites that run: every module in bench/suites/ is a suite (its
one-line question, its options, its run), helpers live in bench/harness/ and never import a
suite, and the decode-layer flags take the config's values."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import pytest

from bench import suites
from bench.__main__ import list_suites

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_suite_loads_and_says_what_it_answers():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert list_suites() == 0
    text = out.getvalue()
    assert "cannot load" not in text, text
    for name in suites.names():
        mod = suites.load(name)
        assert mod.DESCRIPTION and "\n" not in mod.DESCRIPTION, name
        suites.parser(name, mod).parse_args([])  # its options have working defaults


def test_the_harness_never_imports_a_suite():
    for path in sorted((ROOT / "bench" / "harness").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("bench.suites") for n in names), \
                f"{path.relative_to(ROOT)} imports a suite"


def test_the_old_fused_layer_flag_names_its_replacement(capsys):
    parser = suites.parser("anatomy")
    with pytest.raises(SystemExit):
        parser.parse_args(["--fused-layer", "five"])
    err = capsys.readouterr().err
    assert "--fused-layer is now --decode-layer" in err and "five: fused" in err
    args = parser.parse_args(["--decode-layer", "fused", "--no-fused-rotary", "--fused-pdl"])
    from bench.harness.fused_args import fused_config

    assert fused_config(args) == dict(decode_layer="fused", fused_rotary=False, fused_pdl=True,
                                      pdl_overlap="prefetch", gemm_table=None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--decode-layer", "six"])


@pytest.mark.parametrize("old", sorted(suites.MERGED))
def test_a_merged_suite_names_the_part_that_took_it_over(old):
    with pytest.raises(ValueError, match=r"is now `python -m bench [a-z-]+ --parts [a-z]+"):
        suites.load(old)
    new, _, rest = suites.MERGED[old].partition(" ")
    parts = rest.split()[1]
    args = suites.parser(new).parse_args(["--parts", parts])
    assert args.parts == [parts]  # the part it names exists


@pytest.mark.parametrize("suite", ["watch-cost", "default-model"])
def test_a_part_outside_the_suites_parts_is_refused_naming_them(suite, capsys):
    with pytest.raises(SystemExit):
        suites.parser(suite).parse_args(["--parts", "telemetry,nonsense"])
    assert "parts must be among" in capsys.readouterr().err


def test_watch_cost_runs_the_sampler_part_by_default_only_on_cuda():
    from bench.suites.watch_cost import parts_of

    parser = suites.parser("watch-cost")
    assert parts_of(parser.parse_args(["--device", "cpu"])) == ["telemetry"]
    assert parts_of(parser.parse_args(["--device", "cuda"])) == ["telemetry", "sampler"]
    asked = parser.parse_args(["--parts", "dashboard,telemetry"])
    assert parts_of(asked) == ["telemetry", "dashboard"]  # the dashboard part runs last
