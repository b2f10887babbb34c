"""The action a guard carries out, where it cannot be the one policy wanted: decided once, in one place."""

from __future__ import annotations

import pytest

from morphguard.models import Decision
from morphguard.proxy.guard import _carried_out


def wanted(action: str) -> Decision:
    return Decision(profile="default", topic="general", threshold=0.5, flagged=True, action=action)


@pytest.mark.parametrize("action", ["highlight", "cite", "regenerate", "block"])
def test_an_answer_already_sent_can_only_be_annotated(action):
    decision = _carried_out(wanted(action), action, can_change=False, can_reask=True, regenerated=False)
    assert (decision.action, decision.reason) == ("annotate", f"{action} not possible: the answer was already sent")


def test_an_api_that_cannot_ask_again_withholds_instead_of_regenerating():
    decision = _carried_out(wanted("regenerate"), "regenerate", can_change=True, can_reask=False, regenerated=False)
    assert (decision.action, decision.reason) == ("block", "regenerate not possible on this API: blocked")


def test_a_regenerated_answer_is_a_regeneration_whatever_it_scored():
    passed = wanted("pass").model_copy(update={"flagged": False})
    decision = _carried_out(passed, "regenerate", can_change=True, can_reask=True, regenerated=True)
    assert (decision.action, decision.flagged, decision.reason) == ("regenerate", False, None)


@pytest.mark.parametrize("action", ["pass", "annotate", "highlight", "block"])
def test_what_can_be_carried_out_stays_as_policy_decided(action):
    decision = wanted(action)
    assert _carried_out(decision, action, can_change=True, can_reask=False, regenerated=False) is decision
    if action in ("pass", "annotate"):
        assert _carried_out(decision, action, can_change=False, can_reask=False, regenerated=False) is decision
