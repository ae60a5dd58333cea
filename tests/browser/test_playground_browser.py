"""The Playground in a real browser: a prompt's reply streams back in pieces, and two tabs
(two sessions) stream their replies at the same time; Stop aborts a streaming reply in the
engine (the engine's own end, "abort", is read back under the partial text); an engine
stopped with SIGSTOP mid-reply is announced on the Playground within seconds, and the reply
goes on once it resumes.
"""

from __future__ import annotations

import os
import re
import signal
import time

from dashboard_driver import (  # skips this module where there is no browser
    BROWSER_MARKS,
    ask,
    body_text,
    engine_pid,
    goto_page,
    long_replies,
    new_tab,
    shoot,
    sync_api,
)

pytestmark = BROWSER_MARKS


def test_playground_prompt_streams_back_text(page: sync_api.Page) -> None:
    goto_page(page, "Playground")
    page.evaluate(
        """() => {
          window.__replyLengths = [];
          const seen = () => {
            const msgs = document.querySelectorAll('[data-testid="stChatMessage"]');
            const last = msgs[msgs.length - 1];
            const code = last && last.querySelector('code');
            if (code) window.__replyLengths.push(code.textContent.length);
          };
          new MutationObserver(seen).observe(document.body,
            {subtree: true, childList: true, characterData: true});
        }"""
    )
    long_replies(page)
    box = page.locator('[data-testid="stChatInputTextArea"]')
    box.fill("def fibonacci(n):")
    box.press("Enter")
    page.wait_for_function(
        "() => document.body.innerText.includes('TTFT') && window.__replyLengths.length > 0",
        timeout=120_000,
    )
    lengths = page.evaluate("window.__replyLengths")
    distinct = sorted({n for n in lengths if n > 0})
    assert len(distinct) >= 2, f"the reply appeared at once, not streamed: lengths {distinct}"
    shoot(page, "playground")


REPLY_TIMES_JS = """() => {
  const replies = () => document.querySelectorAll('[data-testid="stChatMessage"] code').length;
  const figures = () => document.body.innerText.split('TTFT').length - 1;
  const before = {replies: replies(), figures: figures()};
  window.__firstText = null; window.__done = null;
  if (window.__replyObserver) window.__replyObserver.disconnect();
  window.__replyObserver = new MutationObserver(() => {
    if (window.__firstText === null && replies() > before.replies) {
      const codes = document.querySelectorAll('[data-testid="stChatMessage"] code');
      if (codes[codes.length - 1].textContent.length) window.__firstText = Date.now();
    }
    if (window.__done === null && figures() > before.figures) window.__done = Date.now();
  });
  window.__replyObserver.observe(document.body,
    {subtree: true, childList: true, characterData: true});
}"""


def test_two_tabs_stream_at_the_same_time(server, browser, page) -> None:
    """Two browser tabs (two sessions), one prompt each: both replies stream together."""
    tabs = [new_tab(browser, server[0].rstrip("/") + "/playground") for _ in range(2)]
    try:
        for tab in tabs:
            tab.set_default_timeout(120_000)
            tab.locator('[data-testid="stChatInputTextArea"]').wait_for()
            tab.evaluate(REPLY_TIMES_JS)
            ask(tab, "import sys")
            tab.wait_for_function("() => window.__done !== null")
        for tab in tabs:
            long_replies(tab)
            tab.evaluate(REPLY_TIMES_JS)
        for tab, prompt in zip(tabs, ("import os", "class Stack:"), strict=True):
            ask(tab, prompt)
        for tab in tabs:
            tab.wait_for_function("() => window.__done !== null")
        spans = [tab.evaluate("[window.__firstText, window.__done]") for tab in tabs]
        (a0, a1), (b0, b1) = spans
        assert a0 is not None and b0 is not None, spans
        assert a0 < b1 and b0 < a1, f"the replies did not overlap: {spans}"
    finally:
        for tab in tabs:
            tab.close()


STREAMING_JS = """() => {
  const msgs = document.querySelectorAll('[data-testid="stChatMessage"]');
  const last = msgs[msgs.length - 1];
  const code = last && last.querySelector('code');
  return !!code && code.textContent.length > 0
    && !document.body.innerText.includes('Partial reply')
    && [...last.querySelectorAll('button')].some(b => b.innerText.includes('Stop')
                                                 && b.offsetParent !== null);
}"""


def stop_button(tab: sync_api.Page) -> sync_api.Locator:
    """The reply's Stop (a button with help renders a hidden twin; the sidebar's "Stop
    strings" has a help button named after it)."""
    return tab.locator('[data-testid="stChatMessage"] button:visible').filter(has_text="Stop")


def _fresh_playground(tab: sync_api.Page) -> None:
    """Clear the conversation (a reply of an earlier test must not count) and ask for the
    longest reply the page allows."""
    tab.get_by_role("button", name="Clear the conversation").click()
    tab.wait_for_function(
        "() => document.querySelectorAll('[data-testid=\"stChatMessage\"]').length === 0")
    long_replies(tab)


def test_stop_aborts_the_streaming_reply_in_the_engine(server, browser) -> None:
    tab = new_tab(browser, server[0].rstrip("/") + "/playground")
    try:
        tab.set_default_timeout(120_000)
        tab.locator('[data-testid="stChatInputTextArea"]').wait_for()
        text = body_text(tab)
        # The engine's mode line is the banner's alone (the page drew a second one).
        assert len(re.findall(r"mode (?:async|sync) ·", text)) == 1, text[:2000]
        _fresh_playground(tab)
        ask(tab, "def parse(line):")
        tab.wait_for_function(STREAMING_JS)
        stop_button(tab).click()
        tab.wait_for_function("() => document.body.innerText.includes('finished: abort')")
        text = body_text(tab)
        assert "Partial reply, stopped (Stop button)" in text, text[-2000:]
        line = next(ln for ln in text.splitlines() if "finished: abort" in ln)
        tokens = int(re.search(r"(\d+) tokens? · e2e", line).group(1))  # type: ignore[union-attr]
        assert 0 < tokens < 512, line  # cut by the abort, not run to max tokens
        assert "past EOS" in line and line.startswith("greedy · max 512 tokens"), line
        shoot(tab, "playground-stopped")
    finally:
        tab.close()


def test_a_hung_engine_is_announced_mid_reply(server, browser) -> None:
    tab = new_tab(browser, server[0].rstrip("/") + "/playground")
    pid = engine_pid(server[1])
    stopped = False
    try:
        tab.set_default_timeout(120_000)
        tab.locator('[data-testid="stChatInputTextArea"]').wait_for()
        _fresh_playground(tab)
        ask(tab, "class Parser:")
        tab.wait_for_function(STREAMING_JS)
        os.kill(pid, signal.SIGSTOP)
        stopped, t_stop = True, time.monotonic()
        # The notice is the message and its button: Streamlit sends them as two elements,
        # and the browser can draw the message a moment before the button, so the wait is
        # for both (reading the button the instant the message shows raced with it).
        tab.wait_for_function(
            "() => document.body.innerText.includes('The engine is not responding') && "
            "[...document.querySelectorAll('button')].some("
            "b => b.innerText.includes('Kill and restart the engine'))",
            timeout=30_000)
        said_after = time.monotonic() - t_stop
        shoot(tab, "playground-hung")
        os.kill(pid, signal.SIGCONT)
        stopped = False
        # Resumed: the notice goes, the reply ends (Stop, to not wait for 512 tokens).
        tab.wait_for_function(
            "() => !document.body.innerText.includes('The engine is not responding')")
        stop = stop_button(tab)
        if stop.count():
            stop.click()
        tab.wait_for_function("() => document.body.innerText.includes('TTFT')")
        print(f"hung engine announced on the Playground {said_after:.1f} s after SIGSTOP")
        # The client calls an engine silent after 2 s; polls and a redraw add a little.
        assert said_after < 6.0, f"announced {said_after:.1f} s after SIGSTOP"
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        tab.close()
