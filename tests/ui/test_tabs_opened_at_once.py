"""Tabs opened at once draw their figures: none fails on a half-imported pandas.

Each tab's first run imports what the dashboard needs on its own thread. Plotly looks pandas
up in sys.modules without importing it; while one tab was still importing pandas, another
tab's figure found the module half made and its page showed "partially initialized module
'pandas'". Here, in a fresh interpreter, one "tab" imports pandas and the import is held
half made while three others run app.py's imports and build a timeline bar.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SESSIONS = r'''
import ast, importlib.abc, importlib.machinery, sys, threading

REPO = sys.argv[1]
sys.path.insert(0, REPO)
HOLD_S = 3.0  # the longest pandas stays half made (tabs that wait for it wait this long)
importing = threading.Event()  # pandas is in sys.modules, not yet run
tabs_done = threading.Event()


class HalfMadePandas(importlib.abc.MetaPathFinder):
    """pandas' import, held with the module in sys.modules and not yet run."""

    def find_spec(self, name, path=None, target=None):
        if name != "pandas":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            importing.set()
            tabs_done.wait(HOLD_S)
            run(module)

        spec.loader.exec_module = exec_module
        return spec


tree = ast.parse(open(f"{REPO}/app.py").read())
statements = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
pandas = [n for n in statements
          if isinstance(n, ast.Import) and any(a.name == "pandas" for a in n.names)]
# Everything app.py imports but pandas, imported once first: the tabs then reach their
# figures at once, while pandas is still half made.
exec(compile(ast.Module([n for n in statements if n not in pandas], []), "app.py", "exec"),
     {})
imports = compile(ast.Module(statements, []), "app.py", "exec")
errors = []


def tab():
    importing.wait()
    try:
        exec(imports, {})
        import numpy as np
        import plotly.graph_objects as go

        go.Bar(orientation="h", x=np.array([1.0]), y=np.array([0.0]), base=np.array([0.0]),
               hovertext=np.array(["a step"]), hoverinfo="text")
    except Exception as e:
        errors.append(repr(e))


def first_tab():
    import pandas  # noqa: F401


sys.meta_path.insert(0, HalfMadePandas())
tabs = [threading.Thread(target=tab) for _ in range(3)]
for t in [threading.Thread(target=first_tab), *tabs]:
    t.start()
for t in tabs:
    t.join()
tabs_done.set()
print("ERRORS", errors)
'''


def test_tabs_opened_at_once_never_meet_a_half_imported_pandas() -> None:
    out = subprocess.run([sys.executable, "-c", SESSIONS, str(REPO)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERRORS []" in out.stdout, out.stdout[-2000:]
