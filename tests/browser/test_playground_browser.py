"""The Playground in a real browser: a prompt's reply streams back in pieces, and two tabs
(two sessions) stream their replies at the same time.
"""

from __future__ import annotations

from dashboard_driver import (  # skips this module where there is no browser
    BROWSER_MARKS,
    ask,
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
