"""The dashboard's install (`bash scripts/setup.sh`, requirements.txt) has no triton: every
module of engine/ and telemetry/ must import there, and an engine must start and serve.

Run in a child interpreter in which `import triton` raises ImportError, as it does on a machine
without the package, whatever this test environment has installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Makes triton (and its submodules) unimportable in the child before anything else runs.
BLOCK_TRITON = textwrap.dedent(
    """
    import importlib.abc, sys

    class _NoTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _NoTriton())
    for _m in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[_m]
    """
)

# Modules that are Triton kernels and nothing else: the engine imports them only once it has
# chosen a Triton backend, which it never does without triton.
TRITON_KERNEL_MODULES = ("engine.attention.triton_paged",)

IMPORT_ALL = BLOCK_TRITON + f"KERNEL_MODULES = {TRITON_KERNEL_MODULES!r}\n" + textwrap.dedent(
    """
    import importlib, pkgutil, traceback
    failed = []
    names = []
    for pkg in ("engine", "telemetry"):
        mod = importlib.import_module(pkg)
        names.append(pkg)
        names += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".")]
    for name in names:
        if name.endswith("__main__"):
            continue
        try:
            importlib.import_module(name)
        except ImportError as e:
            if not (name in KERNEL_MODULES and "triton" in str(e)):
                failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
        except Exception:
            failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
    try:
        import triton  # noqa: F401
        failed.append("triton imported despite the block")
    except ImportError:
        pass
    print("\\n".join(failed))
    print(f"IMPORTED {len(names) - len(failed)} of {len(names)}")
    sys.exit(1 if failed else 0)
    """
)

GENERATE = BLOCK_TRITON + textwrap.dedent(
    """
    from engine import Engine, EngineConfig, SamplingParams
    cfg = EngineConfig(model="models/gapless-tiny-python", device="cpu", dtype="float32",
                       num_blocks=64, block_size=16, max_num_seqs=4, max_model_len=128)
    with Engine(cfg) as eng:
        out = eng.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0.0))
    assert len(out[0].token_ids) == 8, out
    print("GENERATED", len(out[0].token_ids))
    """
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_every_engine_module_imports_without_triton():
    r = _run(IMPORT_ALL)
    assert r.returncode == 0, f"modules that fail without triton:\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "IMPORTED" in r.stdout


def test_an_engine_generates_without_triton():
    r = _run(GENERATE)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "GENERATED 8" in r.stdout
