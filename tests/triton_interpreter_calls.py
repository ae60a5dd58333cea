"""Triton's interpreter (TRITON_INTERPRET=1, the kernel tests' CPU children) without its
per-call re-patching of triton.language: installed by tests/conftest.py in those children only.

What it changes, and why it is safe: a kernel launch (GridExecutor.__call__) patches
triton.language for its run (every builtin wrapped to the interpreter's semantics, through
``inspect.getmembers`` of tl, tl.tensor, tl.math) and restores it afterwards. Each call of a
``@triton.jit`` helper *inside* that kernel (InterpretedFunction.__call__) patches it again,
although it is patched already: the builtins are wrapped, so the second pass finds none to
wrap, and only re-sets the same tensor and language hooks. In Triton 3.9 that pass costs about
as much as a small helper's body, a large share of the interpreter's time in a kernel test
whose kernels call many helpers. Here a helper call skips it when every language module its
globals hold is already patched by the launch around it; any other call (a helper called
outside a launch, or one whose globals hold a module the launch did not patch) takes Triton's
own path. The values a kernel computes come from the same interpreter semantics either way.

Never imported outside a TRITON_INTERPRET=1 process; a Triton whose interpreter lacks these
names is left alone (install() returns False).
"""

from __future__ import annotations

import inspect

_active: list[frozenset[int]] = []  # ids of the language modules each running launch patched


def install() -> bool:
    """Wrap the interpreter's launch and helper calls; False (nothing changed) if this
    Triton's interpreter does not have the shape this was written for."""
    from triton.runtime import interpreter as interp

    names = ("GridExecutor", "InterpretedFunction", "_patch_lang", "InterpreterError")
    if not all(hasattr(interp, n) for n in names) or getattr(interp, "_gapless_calls", False):
        return False
    tl = interp.tl
    launch = interp.GridExecutor.__call__

    def langs_of(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values()
                         if inspect.ismodule(v) and v in (tl, tl.core))

    def launch_call(self, *args, **kwargs):
        _active.append(langs_of(self.fn))
        try:
            return launch(self, *args, **kwargs)
        finally:
            _active.pop()

    def helper_call(self, *args, **kwargs):
        langs = self.__dict__.get("_gapless_langs")
        if langs is None:
            langs = self._gapless_langs = langs_of(self.fn)
        if not (langs and _active and langs <= _active[-1]):
            interp._patch_lang(self.fn)  # Triton's own path
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp.GridExecutor.__call__ = launch_call
    interp.InterpretedFunction.__call__ = helper_call
    interp._gapless_calls = True
    return True
