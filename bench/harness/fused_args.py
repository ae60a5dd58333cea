"""The decode-layer options of the gapless rows (config keys fused_layer, fused_pdl,
pdl_overlap; issue 22), as the suites that build engines take them on the command line.

Owns the three flags and the config keywords they give; suites pass the keywords to
EngineConfig unchanged, so a benchmark row runs exactly what config.yaml would select.
"""

from __future__ import annotations

import argparse

from engine.config import PDL_OVERLAPS


def add_fused_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fused-layer", default="plain",
                        help="config key fused_layer of the gapless rows: plain | epilogues | "
                             "six | five | auto | persistent (issue 22)")
    parser.add_argument("--fused-pdl", action="store_true",
                        help="config key fused_pdl: the fused kernels and the Triton attention "
                             "with programmatic dependent launch")
    parser.add_argument("--pdl-overlap", default="prefetch", choices=PDL_OVERLAPS,
                        help="config key pdl_overlap (with --fused-pdl)")


def fused_config(args: argparse.Namespace) -> dict:
    """EngineConfig keywords for the flags above."""
    return dict(fused_layer=args.fused_layer, fused_pdl=args.fused_pdl,
                pdl_overlap=args.pdl_overlap)
