"""The benchmark command line.

    python -m bench list                          # the suites and what each measures
    python -m bench SUITE [--out DIR] [options]   # one suite (python -m bench SUITE -h)
    python -m bench gpu --suites a,b [--budget a=SECONDS,...] [--args a='...'] [-- options]
    python -m bench ab SUITE --trees BEFORE,AFTER [--rounds 3] [-- options]

A suite writes JSON + markdown into artifacts/bench/<date>-<machine>-<commit>/<suite>/ (or --out;
git ignores artifacts/);
the harness adds stdout.txt (what it printed) and summary.json (its returned summary with the
command, machine and commit).
`gpu` runs several suites, each in its own process with its own time budget, into one folder;
`ab` runs one suite against two source trees in alternated rounds and compares the medians.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench import suites


def list_suites() -> int:
    width = max(len(n) for n in [*suites.names(), "gpu"])
    for name in suites.names():
        try:
            desc = suites.load(name).DESCRIPTION
        except Exception as exc:  # a half-written suite must not hide the others
            desc = f"(cannot load: {type(exc).__name__}: {exc})"
        print(f"{name:<{width}}  {desc}")
    print(f"{'gpu':<{width}}  several suites in one call, each in its own process with a "
          "time budget (python -m bench gpu -h)")
    print(f"{'ab':<{width}}  one suite against two source trees, alternated rounds, a verdict "
          "(python -m bench ab -h)")
    return 0


class _Tee:
    """A stdout that also writes to a file (the suite's printed tables stay in its folder)."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()

    def __getattr__(self, name: str):
        return getattr(self.streams[0], name)

    def __enter__(self) -> _Tee:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def run_suite(name: str, argv: list[str]) -> int:
    from bench.harness import report

    try:
        mod = suites.load(name)
    except ValueError as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2
    args = suites.parser(name, mod).parse_args(argv)
    out = Path(args.out) if args.out else report.run_folder() / name
    out.mkdir(parents=True, exist_ok=True)
    print(f"[bench] {name} -> {out}", flush=True)
    with open(out / "stdout.txt", "w") as copy, _Tee(sys.stdout, copy) as tee:
        prev, sys.stdout = sys.stdout, tee
        try:
            summary = mod.run(args, out)
        finally:
            sys.stdout = prev
    report.write_json(out / "summary.json", {"meta": report.meta(), "suite": name,
                                             "args": vars(args), "summary": summary})
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "list":
        return list_suites()
    if name == "gpu":
        from bench.harness import runner

        return runner.main(rest)
    if name == "ab":
        from bench.harness import ab

        return ab.main(rest)
    return run_suite(name, rest)


if __name__ == "__main__":
    raise SystemExit(main())
