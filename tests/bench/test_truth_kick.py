"""The truth suite's retry of a reference window that lost every kernel record (CPU)."""

from bench.harness.truth_kick import attempts_markdown, lost_all, with_retries


def windows(*refs):
    """A fake reference window: each call the next of ``refs``, with its call number."""
    calls = []

    def window():
        calls.append(len(calls))
        return refs[len(calls) - 1], [(len(calls), 0)], 10 * len(calls), 10 * len(calls) + 5
    return window, calls


LOST = {"busy": None, "kernels": 0, "lost_launches": 300, "why": "no kernel record"}
GOOD = {"busy": 0.42, "kernels": 310, "lost_launches": 0}


def test_a_window_that_kept_its_kernels_is_not_tried_again():
    window, calls = windows(GOOD)
    kicks = []
    ref, iv, t0, t1 = with_retries(window, True, kicker=lambda: kicks.append(1) or {})
    assert ref == GOOD and "attempts" not in ref and calls == [0] and not kicks
    assert iv == [(1, 0)] and (t0, t1) == (10, 15)


def test_a_lost_window_is_kicked_and_tried_again_and_every_attempt_is_kept():
    window, calls = windows(LOST, GOOD)
    ref, iv, t0, t1 = with_retries(window, True, kicker=lambda: {"kick": "graph", "kernels": 3})
    assert calls == [0, 1] and ref["busy"] == 0.42 and (t0, t1) == (20, 25) and iv == [(2, 0)]
    first, last = ref["attempts"]
    assert first["busy"] is None and first["lost_launches"] == 300
    assert first["kick_after"] == {"kick": "graph", "kernels": 3}
    assert last == {"busy": 0.42, "lost_launches": 0, "why": None}


def test_retries_stop_at_the_limit_and_the_last_loss_is_the_result():
    window, calls = windows(LOST, LOST, LOST, GOOD)
    ref, *_ = with_retries(window, True, retries=2, kicker=dict)
    assert calls == [0, 1, 2] and ref["busy"] is None and len(ref["attempts"]) == 3


def test_no_retry_on_a_cpu_or_for_a_window_with_nothing_launched():
    window, calls = windows(LOST)
    assert with_retries(window, False, kicker=dict)[0] is LOST and calls == [0]
    assert not lost_all({"busy": None, "lost_launches": 0})  # nothing launched: no loss
    assert lost_all(LOST) and not lost_all(GOOD)


def test_the_report_lists_each_try_and_its_kick():
    rep = {"attempts": [{"busy": None, "lost_launches": 300,
                         "kick_after": {"kick": "graph", "kernels": 3, "eager_kernels": 2,
                                        "graph_kernels": 1, "free_mib": 1234,
                                        "probes": {"main_default": 1, "new_thread": 0}}},
                        {"busy": 0.42, "lost_launches": 0}]}
    shapes = {"llama-8b": {"modes": {"async-eager": {"repeats": [{}, rep]}}}}
    lines = attempts_markdown(shapes)
    assert lines[1].startswith("## Reference windows tried again")
    assert lines[-2] == ("| llama-8b | async-eager | 2 | 1 | lost 300 launches' kernels; then a "
                         "kick: graph, 3 kernel records (eager 2, graph 1), 1234 MiB free; probes "
                           "main_default 1, new_thread 0 |")
    assert lines[-1] == "| llama-8b | async-eager | 2 | 2 | kept its kernels |"
    assert attempts_markdown({"x": {"modes": {"m": {"repeats": [{}]}}}}) == []
