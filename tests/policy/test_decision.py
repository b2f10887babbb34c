"""Policy's one decision on an answer (`PolicyEngine.decide`): the rule applied to what the check found, what the
answer holds beside its text, and what its way to the client can still change; nothing after it changes the action."""

from __future__ import annotations

from dataclasses import replace

import pytest

from morphguard.config import PolicySettings, ProxySettings
from morphguard.models import Detection, RagInput
from morphguard.policy.engine import ACTIONS, Finding, Holds, PolicyEngine, Reach, changes_answer
from morphguard.proxy.stream_modes import stream_mode
from morphguard.settle.values import CheckRequest

FLAGGED = Finding(Detection(detector="grounding", score=0.9, threshold=0.5, flagged=True))
PASSED = Finding(Detection(detector="grounding", score=0.1, threshold=0.5, flagged=False))


def engine(action: str = "block", **policy) -> PolicyEngine:
    return PolicyEngine(PolicySettings.model_validate(
        {"profiles": {"general": {"action": action, "threshold": 0.5, "escalate": True, "topics": {}}}, **policy}))


def decide(e: PolicyEngine, finding: Finding, holds: Holds | None = None, reach: Reach = Reach.REWRITE):
    return e.decide("general", "general", finding, holds or Holds(), reach)


@pytest.mark.parametrize("action", ["highlight", "cite", "regenerate", "block"])
def test_an_answer_already_sent_can_only_be_annotated(action):
    decision = decide(engine(action), FLAGGED, reach=Reach.NONE)
    assert (decision.action, decision.reason) == ("annotate", f"{action} not possible: the answer was already sent")
    assert decision.flagged and decision.escalate


def test_an_api_that_cannot_ask_again_withholds_instead_of_regenerating():
    decision = decide(engine("regenerate"), FLAGGED, reach=Reach.REWRITE)
    assert (decision.action, decision.reason) == ("block", "regenerate not possible on this API: blocked")
    assert decide(engine("regenerate"), FLAGGED, reach=Reach.ASK_AGAIN).action == "regenerate"


@pytest.mark.parametrize(("action", "carried"), [("block", "block"), ("regenerate", "block"),
                                                 ("highlight", "annotate"), ("cite", "annotate"),
                                                 ("annotate", "annotate"), ("pass", "pass")])
def test_a_stream_checked_as_it_flows_can_only_withhold_what_it_still_holds(action, carried):
    assert decide(engine(action), FLAGGED, reach=Reach.WITHHOLD).action == carried


@pytest.mark.parametrize("action", ["pass", "annotate", "highlight", "cite", "regenerate", "block"])
def test_what_can_be_carried_out_stays_as_the_rule_says(action):
    decision = decide(engine(action), FLAGGED, reach=Reach.ASK_AGAIN)
    assert (decision.action, decision.reason, decision.flagged) == (action, None, True)
    assert decide(engine(action), PASSED, reach=Reach.NONE).action == "pass"


def test_unreadable_output_is_noted_and_blocked_where_policy_says_so():
    holds = Holds(unreadable=("image_generation_call", "audio", "audio"))
    noted = decide(engine("annotate"), PASSED, holds)
    assert (noted.action, noted.reason) == ("pass", "unreadable_output: audio, image_generation_call")
    blocked = decide(engine("annotate", unreadable_output="block"), PASSED, holds)
    assert (blocked.action, blocked.escalate) == ("block", False)
    # a passing text does not let an answer through whose other parts could not be read
    assert decide(engine("annotate", unreadable_output="block"), PASSED, holds, Reach.WITHHOLD).action == "block"
    sent = decide(engine("annotate", unreadable_output="block"), PASSED, holds, Reach.NONE)
    assert (sent.action, sent.reason) == ("annotate", "block not possible: the answer was already sent")


def test_unchecked_tool_calls_are_noted_and_nothing_is_noted_without_context():
    e = engine("block", tool_calls="record")
    assert decide(e, PASSED, Holds(tool_calls=True)).reason == "tool_calls_unchecked"
    assert decide(engine("block"), PASSED, Holds(tool_calls=True)).reason is None  # checked with the text
    unchecked = decide(e, Finding(skipped="no_context"), Holds(unreadable=("audio",), tool_calls=True))
    assert (unchecked.action, unchecked.reason) == ("pass", "no_context")
    empty = decide(e, Finding(skipped="no_answer"), Holds(unreadable=("audio",)))
    assert (empty.action, empty.reason) == ("pass", "no_answer; unreadable_output: audio")


@pytest.mark.parametrize(("on_error", "action"), [("fail_open", "pass"), ("fail_closed", "block")])
def test_a_failed_check_is_decided_as_on_error_says(on_error, action):
    e = PolicyEngine(PolicySettings.model_validate(
        {"profiles": {"general": {"action": "annotate", "on_error": on_error, "topics": {}}}}))
    decision = e.decide("general", "general", Finding(failed="judge_timeout"))
    assert (decision.action, decision.flagged, decision.reason) == (action, False, f"{on_error}: judge_timeout")
    assert decision.unchecked is (on_error == "fail_open")


@pytest.mark.parametrize(("action", "decided"), [("block", "block"), ("regenerate", "block"), ("annotate", "pass"),
                                                 ("highlight", "pass"), ("cite", "pass")])
def test_by_default_a_failed_check_fails_closed_only_where_the_action_ends_the_answer(action, decided):
    decision = decide(engine(action), Finding(failed="judge_error"))
    mode = "fail_closed" if decided == "block" else "fail_open"
    assert (decision.action, decision.reason, decision.unchecked) == (decided, f"{mode}: judge_error",
                                                                      mode == "fail_open")


def test_a_topic_that_blocks_fails_closed_under_a_profile_that_annotates_unless_it_says_fail_open():
    e = PolicyEngine(PolicySettings.model_validate({"profiles": {"general": {"action": "annotate", "topics": {
        "healthcare": {"action": "block"}, "legal": {"action": "block", "on_error": "fail_open"}}}}}))
    failed = Finding(failed="latency_budget_exceeded")
    assert e.decide("general", "general", failed).action == "pass"
    assert e.decide("general", "healthcare", failed).action == "block"
    legal = e.decide("general", "legal", failed)
    assert (legal.action, legal.unchecked, legal.reason) == ("pass", True, "fail_open: latency_budget_exceeded")


def test_a_blocking_profile_that_says_fail_open_passes_a_failed_check_marked_unchecked():
    decision = decide(engine("block", profiles={"general": {"action": "block", "on_error": "fail_open"}}),
                      Finding(failed="judge_call_cap"))
    assert (decision.action, decision.unchecked, decision.reason) == ("pass", True, "fail_open: judge_call_cap")
    assert not decide(engine("block"), PASSED).unchecked and not decide(engine("block"), FLAGGED).unchecked


def test_the_strongest_action_counts_what_unreadable_output_may_do():
    assert engine("annotate").strongest("general", "general") == "annotate"
    assert engine("annotate", unreadable_output="block").strongest("general", "general") == "block"


@pytest.mark.parametrize("action", ACTIONS)
def test_one_predicate_says_whether_a_rule_can_change_the_answer_and_every_caller_asks_it(action):
    """What an answer already sent can carry (the engine) and whether a stream is checked as it flows
    (`stream_mode`'s `auto`) are the same question: asked of `changes_answer` alone."""
    changes = changes_answer(action)
    assert changes == (action not in ("pass", "annotate"))
    assert (decide(engine(action), FLAGGED, reach=Reach.NONE).action == action) == (not changes)
    request = CheckRequest(body={}, rag=None, source=None, profile="general", topic="general")
    chosen = stream_mode(ProxySettings(), action, replace(request, rag=RagInput(question="q", passages=["p"])),
                         tool_calls_checked=True)
    assert (chosen == "incremental") == changes
