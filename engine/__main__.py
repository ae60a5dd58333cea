"""Command-line generation: `python -m engine "def fibonacci(n):" --max-tokens 48`.
`python -m engine serve --help`: the OpenAI-compatible HTTP server (engine/serving/serve.py).

Owns argument parsing and printing only; everything else is the in-process Engine API.
"""

from __future__ import annotations

import argparse
import sys

from engine.config import EngineConfig, SamplingParams


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from engine.serving.serve import main as serve

        return serve(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    ap.add_argument("prompts", nargs="+", help="prompts; several run batched together")
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--model", help="override config.yaml's model (folder or hub id)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--sync", action="store_true", help="synchronous steps (default: async)")
    args = ap.parse_args(argv)
    overrides = {k: v for k, v in (("model", args.model), ("device", args.device)) if v}
    if args.sync:
        overrides["async_batching"] = False
    try:
        cfg = EngineConfig.from_yaml(args.config, **overrides)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        params.validate()
        from engine.engine import Engine

        engine = Engine(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if len(args.prompts) == 1:
            handle = engine.submit(args.prompts[0], params)
            sys.stdout.write(args.prompts[0])
            for delta in handle:
                sys.stdout.write(delta)
                sys.stdout.flush()
            out = handle.result()
            print(f"\n[{len(out.token_ids)} tokens, {out.finish_reason}]", file=sys.stderr)
            outs = [out]
        else:
            outs = engine.generate(args.prompts, params)
            for prompt, out in zip(args.prompts, outs, strict=True):
                print(f"--- {prompt!r} [{len(out.token_ids)} tokens, {out.finish_reason}]")
                print(prompt + out.text)
        failed = [o for o in outs if o.finish_reason == "error"]
        for o in failed:
            print(f"error: request {o.request_id} failed: {o.error}", file=sys.stderr)
        if failed:
            return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
