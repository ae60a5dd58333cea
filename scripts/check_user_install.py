"""Checks the README's first line as a user meets it: after `bash scripts/setup.sh` (no dev
tools), the dashboard serves the default model and `engine serve` answers a completion.

1. `streamlit run app.py` answers its health check, and its first page, opened in headless
   Chromium, shows the engine serving the configured model (the page text names the model
   in the mode line the engine reports, and offers "Start load").
   A prompt typed into the Playground's chat input gets a streamed reply.
2. `python -m engine serve` answers /health and a /v1/completions request with text.

Runs with the user's virtual environment only: the browser is driven over the Chrome DevTools
protocol with `websockets` (a dependency of streamlit), so no test tool is needed. Chromium is
the user's browser here: Debian's package, /usr/bin/chromium. Exits non-zero with the reason
on the first check that fails; prints what it saw on success. Never leaves a process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1600,1000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_url(url: str, expect: bytes, limit_s: float, proc: subprocess.Popen[bytes],
             log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            fail(f"{proc.args[2:5]} exited with code {proc.returncode} before answering {url}",
                 log)
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if expect in r.read():
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.25)
    fail(f"{url} did not answer {expect!r} within {limit_s:.0f} s", log)
    return 0.0


def fail(why: str, log: Path | None = None) -> None:
    print(f"check_user_install: FAILED: {why}", file=sys.stderr)
    if log is not None and log.exists():
        print(f"--- the last lines of {log.name}:", file=sys.stderr)
        print("\n".join(log.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)
    raise SystemExit(1)


async def page_text_until(ws_url: str, url: str, wanted: list[str], limit_s: float,
                          ask: str | None = None) -> str:
    """Opens `url` in the page behind `ws_url` and returns its text once it holds every
    string in `wanted` (raises TimeoutError with the last text otherwise). With `ask`, it then
    types `ask` into the page's chat input, presses Enter and returns the text of the last
    chat message once a reply has streamed into it."""
    async with websockets.connect(ws_url, max_size=None) as ws:
        ids = iter(range(1, 1_000_000))

        async def call(method: str, **params: object) -> dict:
            n = next(ids)
            await ws.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("id") == n:
                    return msg.get("result", {})

        await call("Page.enable")
        await call("Page.navigate", url=url)
        t0 = time.monotonic()
        text = ""
        while time.monotonic() - t0 < limit_s:
            r = await call("Runtime.evaluate", expression="document.body ? "
                           "document.body.innerText : ''", returnByValue=True)
            text = r.get("result", {}).get("value", "") or ""
            if all(w in text for w in wanted):
                break
            await asyncio.sleep(0.5)
        else:
            raise TimeoutError(text)
        if ask is None:
            return text
        box = 'document.querySelector(\'[data-testid="stChatInputTextArea"]\')'
        while time.monotonic() - t0 < limit_s:  # the page's script draws the input last
            r = await call("Runtime.evaluate", expression=f"!!{box}", returnByValue=True)
            if r.get("result", {}).get("value"):
                break
            await asyncio.sleep(0.5)
        await call("Runtime.evaluate", expression=f"{box}.focus()")
        await call("Input.insertText", text=ask)
        for kind in ("keyDown", "keyUp"):
            await call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                       windowsVirtualKeyCode=13, text="\r" if kind == "keyDown" else "")
        last = ("(() => { const m = document.querySelectorAll('[data-testid=\"stChatMessage\"]');"
                " return m.length >= 2 ? m[m.length - 1].innerText : ''; })()")
        reply = ""
        while time.monotonic() - t0 < limit_s:
            r = await call("Runtime.evaluate", expression=last, returnByValue=True)
            now = (r.get("result", {}).get("value", "") or "").strip()
            if now and now == reply and ask not in now:
                return now  # the reply has stopped growing
            reply = now
            await asyncio.sleep(1.0)
        raise TimeoutError(f"no reply to {ask!r} in the Playground; last message: {reply!r}")


def check_dashboard(model_name: str, work: Path, limit_s: float) -> None:
    port = free_port()
    log = work / "streamlit.log"
    server = start([sys.executable, "-m", "streamlit", "run", "app.py",
                    "--server.port", str(port)], log)
    browser = None
    try:
        t = wait_url(f"http://127.0.0.1:{port}/_stcore/health", b"ok", 60, server, log)
        print(f"dashboard: health check answered {t:.1f} s after start")
        cdp = free_port()
        profile = work / "chromium-profile"
        browser = start([CHROMIUM, *CHROMIUM_ARGS, f"--remote-debugging-port={cdp}",
                         f"--user-data-dir={profile}", "about:blank"], work / "chromium.log")
        wait_url(f"http://127.0.0.1:{cdp}/json/version", b"Browser", 30, browser,
                 work / "chromium.log")
        with urllib.request.urlopen(f"http://127.0.0.1:{cdp}/json/list", timeout=5) as r:
            pages = [p for p in json.load(r) if p.get("type") == "page"]
        t0 = time.monotonic()
        wanted = [model_name, "settings v", "Start load"]
        try:
            text = asyncio.run(page_text_until(pages[0]["webSocketDebuggerUrl"],
                                               f"http://127.0.0.1:{port}/", wanted, limit_s))
        except TimeoutError as e:
            fail(f"the first page did not show {wanted} within {limit_s:.0f} s; its text "
                 f"was:\n{str(e)[:2000]}", log)
        print(f"dashboard: the first page shows the engine serving {model_name!r} "
              f"{time.monotonic() - t0:.1f} s after it was opened")
        head = " | ".join(line for line in text.splitlines() if line.strip())[:300]
        print(f"dashboard: page text begins: {head}")
        t0 = time.monotonic()
        try:
            reply = asyncio.run(page_text_until(
                pages[0]["webSocketDebuggerUrl"], f"http://127.0.0.1:{port}/playground",
                ["Playground"], limit_s, ask="Write one sentence about the sea."))
        except TimeoutError as e:
            fail(f"the Playground gave no reply: {str(e)[:1000]}", log)
        print(f"dashboard: the Playground replied in {time.monotonic() - t0:.1f} s: "
              f"{reply[:160]!r}")
    finally:
        if browser is not None:
            stop(browser)
        stop(server)


def check_serve(work: Path, limit_s: float) -> None:
    port = free_port()
    log = work / "serve.log"
    serve = start([sys.executable, "-m", "engine", "serve", "--port", str(port)], log)
    try:
        t = wait_url(f"http://127.0.0.1:{port}/health", b"", limit_s, serve, log)
        print(f"engine serve: /health answered {t:.1f} s after start")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "The capital of France is",
                           "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
        text = answer["choices"][0]["text"]
        if not text.strip():
            fail(f"the completion came back empty: {answer}", log)
        print(f"engine serve: {model} completed {answer['usage']['completion_tokens']} "
              f"tokens: {text!r}")
    finally:
        stop(serve)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-limit", type=float, default=300,
                    help="seconds the engine may take to load the model and serve")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        fail(f"{CHROMIUM} is missing: install Debian's chromium package")
    sys.path.insert(0, str(ROOT))
    from engine.config import EngineConfig

    model = EngineConfig.from_yaml(ROOT / "config.yaml").model
    try:
        from transformers import AutoConfig

        name = AutoConfig.from_pretrained(model).name_or_path
    except Exception:
        name = model
    shown = Path(name).name
    work = Path(tempfile.mkdtemp(prefix="gapless-user-check-"))
    try:
        check_dashboard(shown, work, args.engine_limit)
        check_serve(work, args.engine_limit)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("check_user_install: the dashboard and engine serve work after the user's set-up")


if __name__ == "__main__":
    main()
