"""The ways a pregnancy question was moved to a looser topic, without a proxy: the tagger reads the folded text
of the whole conversation and the whole context."""

from __future__ import annotations

import pytest

from morphguard.config import ContextSettings, PolicySettings, TopicRule
from morphguard.models import RagInput
from morphguard.policy.engine import PolicyEngine
from morphguard.policy.topics import TopicTagger
from morphguard.proxy.context import ContextExtractor
from tests.policy.test_folding import SPELLINGS

FILLER = "Please read the following question carefully before you answer it. " * 300  # 20,400 characters


def engine(**policy) -> PolicyEngine:
    return PolicyEngine(PolicySettings.model_validate(policy))


def sensitive() -> PolicyEngine:
    """The shipped topics; pregnancy strict (0.175, block), everything else the general profile's 0.3."""
    return engine(profiles={"general": {"threshold": 0.3, "action": "annotate",
                                        "topics": {"pregnancy": {"threshold": 0.175, "action": "block"}}}})


def topic_of(e: PolicyEngine, question: str, passages: list[str], turns: list[str] | None = None) -> str:
    rag = RagInput(question=question, passages=passages, turns=turns or [])
    return e.topic_for("general", rag)


PASSAGE = "This leaflet describes a common painkiller."


@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_a_disguised_keyword_in_the_question_is_still_the_topic(spelling):
    assert topic_of(sensitive(), f"Can I take it while {spelling}?", [PASSAGE]) == "pregnancy"


def test_the_whole_question_and_the_whole_context_are_read():
    e = sensitive()
    assert topic_of(e, FILLER + "Can I take it while pregnant?", [PASSAGE]) == "pregnancy"
    assert topic_of(e, "Can I take it?", [PASSAGE, FILLER * 10 + "Not advised for pregnant readers."]) == "pregnancy"
    assert topic_of(e, "Can I take it?", [FILLER * 10 + "Not advised for pregnant readers."]) == "pregnancy"


def test_earlier_turns_count_through_the_extractor():
    extractor = ContextExtractor(ContextSettings())
    body = {"model": "m", "messages": [
        {"role": "system", "content": "You answer questions about medicines."},
        {"role": "user", "content": "I am pregnant."},
        {"role": "assistant", "content": "Congratulations! How can I help?"},
        {"role": "user", "content": [{"type": "text", "text": "Can I take it for back pain?"}]}],
        "morphguard": {"context": PASSAGE}}
    rag = extractor.extract(body).rag
    assert rag is not None and rag.question == "Can I take it for back pain?"
    assert rag.turns == ["I am pregnant.", "Congratulations! How can I help?", "Can I take it for back pain?"]
    assert sensitive().topic_for("general", rag) == "pregnancy"
    body["messages"][1:3] = [{"role": "user", "content": "A question about my medicines."},
                             {"role": "assistant", "content": "Sure: is this about your pregnancy?"}]
    assert sensitive().topic_for("general", extractor.extract(body).rag) == "pregnancy"  # a turn the client wrote
    assert "turns" not in rag.model_dump()  # the queue keeps what checks need, not the conversation


def test_a_block_that_is_not_context_is_still_read():
    """With an explicit context, a tagged block in the user's message is neither question nor context."""
    extractor = ContextExtractor(ContextSettings())
    body = {"model": "m", "messages": [{"role": "user", "content": "<documents>I am pregnant.</documents> May I?"}],
            "morphguard": {"context": PASSAGE}}
    rag = extractor.extract(body).rag
    assert rag is not None and rag.question == "May I?"
    assert sensitive().topic_for("general", rag) == "pregnancy"


@pytest.mark.parametrize("phrase", ["We are expecting a baby", "expecting  a\nbaby", "we're expecting twins",
                                    "she is 20 weeks along", "trying to conceive", "after my C-section"])
def test_the_shipped_pregnancy_topic_knows_plain_phrases(phrase):
    assert topic_of(sensitive(), f"{phrase}: is it safe?", [PASSAGE]) == "pregnancy"


def test_untagged_requests_get_the_profiles_own_rule():
    e = engine(profiles={"general": {"threshold": 0.175, "action": "block",
                                     "topics": {"finance": {"threshold": 0.5, "action": "annotate"}}}})
    assert topic_of(e, "What is the capital of France?", [PASSAGE]) == "general"
    assert e.rule("general", "general").threshold == 0.175 and e.rule("general", "general").action == "block"
    assert e.rule("general", "finance").threshold == 0.5


def test_operator_regexes_match_the_text_as_sent_or_folded():
    tagger = TopicTagger({"raw": TopicRule(patterns=[r"\bбеременн"]),
                          "folded": TopicRule(patterns=[r"\bweek \d+ of pregnancy"])})
    assert tagger.topics("Беременность и лекарства") == ["raw"]
    assert tagger.topics("In week 12 of preg\u200bnancy") == ["folded"]


def test_the_deprecated_scan_limit_is_accepted_and_ignored(caplog):
    e = engine(topic_scan_chars=100)
    assert "topic_scan_chars" in caplog.text
    assert topic_of(e, "x" * 500 + " pregnant", []) == "pregnancy"


# --- routes ----------------------------------------------------------------------------------------------


def test_keywords_in_other_scripts_still_match_in_any_case():
    tagger = TopicTagger({"pregnancy": TopicRule(keywords=["беременн*", "εγκυμοσύνη"])})
    for text in ("БЕРЕМЕННОСТЬ", "Беременность", "беременная", "ΕΓΚΥΜΟΣΥΝΗ", "Εγκυμοσύνη"):
        assert tagger.topics(text) == ["pregnancy"], text
    assert tagger.topics("Бережливость") == []
