import math

import pytest

from morphguard.detectors.judgments import judgment_probabilities, parse_judgment
from morphguard.llm.client import TokenChoice
from morphguard.models import Judgment as V


@pytest.mark.parametrize(("text", "verdict", "reason"), [
    ('{"verdict": "YES", "reason": "Stated in passage 1."}', V.YES, "Stated in passage 1."),
    ('{"verdict": "NOT SURE", "reason": "Not mentioned."}', V.NOT_SURE, "Not mentioned."),
    ('{"verdict":"no"}', V.NO, ""),
    ("NO. The passage says the opposite.", V.NO, "The passage says the opposite."),
    ("NOT SURE - nothing about swimming.", V.NOT_SURE, "nothing about swimming."),
    ("not_sure", V.NOT_SURE, ""),
    ("  Yes: it is stated.\nextra line", V.YES, "it is stated."),
])
def test_readable_replies_give_their_verdict_and_reason(text, verdict, reason):
    parsed = parse_judgment(text)
    assert parsed.parsed
    assert parsed.judgment is verdict
    assert parsed.reason == reason


@pytest.mark.parametrize("text", ["", "Maybe.", '{"verdict": "PERHAPS"}', "Nope", "Notably, yes"])
def test_unreadable_replies_count_as_not_sure_and_are_marked(text):
    parsed = parse_judgment(text)
    assert not parsed.parsed
    assert parsed.judgment is V.NOT_SURE


def _tokens(*pieces: str, alternatives: dict[int, list[tuple[str, float]]]) -> list[TokenChoice]:
    return [TokenChoice(p, -0.1, tuple(alternatives.get(i, ()))) for i, p in enumerate(pieces)]


def test_probabilities_are_read_where_the_json_verdict_is_written():
    alts = {3: [("NO", math.log(0.6)), ("NOT", math.log(0.3)), ("YES", math.log(0.1))],
            0: [("YES", math.log(0.99))]}  # the first token's alternatives must be ignored
    tokens = _tokens("{", ' "verdict', '":', ' "', "NO", '",', ' "reason": "x" }',
                     alternatives={4: alts[3], 0: alts[0]})
    probs = judgment_probabilities(tokens)
    assert probs == pytest.approx({V.NO: 0.6, V.NOT_SURE: 0.3, V.YES: 0.1})


def test_probabilities_of_a_plain_reply_come_from_its_first_token():
    tokens = _tokens("YES", ".", alternatives={0: [("YES", math.log(0.5)), ("NO", math.log(0.25)),
                                                   ("Maybe", math.log(0.25))]})
    probs = judgment_probabilities(tokens)
    assert probs == pytest.approx({V.YES: 2 / 3, V.NO: 1 / 3, V.NOT_SURE: 0.0})


def test_no_logprobs_no_probabilities():
    assert judgment_probabilities(None) is None
    assert judgment_probabilities(_tokens("Hmm", alternatives={0: [("Hmm", -0.1)]})) is None


def test_a_fence_the_reply_text_leaves_out_does_not_shift_the_verdict_token():
    """llama.cpp may generate ```json ... ``` around JSON and return only the JSON as content."""
    no = [("NO", math.log(0.7)), ("YES", math.log(0.2)), ("NOT", math.log(0.1))]
    yes = [("YES", math.log(0.9)), ("NO", math.log(0.1))]
    tokens = _tokens("```", "json", "\n", "{", ' "verdicts":', ' ["', "YES", '",', ' "', "NO", '"]}', "\n```",
                     alternatives={6: yes, 9: no})
    assert judgment_probabilities(tokens, occurrence=0, listed=True) == pytest.approx({V.YES: 0.9, V.NO: 0.1,
                                                                                      V.NOT_SURE: 0.0})
    assert judgment_probabilities(tokens, occurrence=1, listed=True) == pytest.approx({V.NO: 0.7, V.YES: 0.2,
                                                                                      V.NOT_SURE: 0.1})
    assert judgment_probabilities(tokens, occurrence=2, listed=True) is None
