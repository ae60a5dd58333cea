"""The decode-layer options of the gapless rows (config keys decode_layer, fused_rotary,
fused_pdl, pdl_overlap, gemm_table), as the suites that build engines take them on the command
line.

Owns the flags and the config keywords they give; suites pass the keywords to EngineConfig
unchanged, so a benchmark row runs exactly what config.yaml would select. The legal values
are engine.config's.
"""

from __future__ import annotations

import argparse

from engine.config import DECODE_LAYERS, PDL_OVERLAPS, RETIRED_KEYS


class _Retired(argparse.Action):
    """--fused-layer: an error that names --decode-layer and how the old values map."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"--fused-layer is now --decode-layer: {RETIRED_KEYS['fused_layer']}")


def add_fused_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fused-layer", action=_Retired, help=argparse.SUPPRESS)
    parser.add_argument("--decode-layer", default="cublas", choices=DECODE_LAYERS,
                        help="config key decode_layer of the gapless rows")
    parser.add_argument("--no-fused-rotary", dest="fused_rotary", action="store_false",
                        help="config key fused_rotary false: keep the separate rotary kernel "
                             "under --decode-layer fused/auto")
    parser.add_argument("--fused-pdl", action="store_true",
                        help="config key fused_pdl: the fused kernels and the Triton attention "
                             "with programmatic dependent launch")
    parser.add_argument("--pdl-overlap", default="prefetch", choices=PDL_OVERLAPS,
                        help="config key pdl_overlap (with --fused-pdl)")
    parser.add_argument("--gemm-table", default=None,
                        help="config key gemm_table: the per-shape table --decode-layer auto "
                             "reads (default: the shipped one)")


def fused_config(args: argparse.Namespace) -> dict:
    """EngineConfig keywords for the flags above."""
    return dict(decode_layer=args.decode_layer, fused_rotary=args.fused_rotary,
                fused_pdl=args.fused_pdl, pdl_overlap=args.pdl_overlap,
                gemm_table=args.gemm_table)
