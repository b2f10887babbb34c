"""Topics, the engine's choice of rule, the text actions and the audit store, without a proxy."""

import sqlite3

import pytest

from morphguard.config import AuditSettings, PolicySettings
from morphguard.models import Decision, Detection, Factoid, RagInput
from morphguard.policy import actions, audit
from morphguard.policy.engine import Finding, PolicyEngine, RequestFacts
from morphguard.policy.record import DecisionRecord


def engine(**policy) -> PolicyEngine:
    return PolicyEngine(PolicySettings.model_validate(policy))


def test_default_tagger_finds_subjects_in_question_and_context():
    e = engine()
    rag = RagInput(question="Can I keep my residence permit if I lose my job?",
                   passages=["Holders of a work-based permit must register as unemployed within 14 days."])
    assert set(e.tagger.tag(rag)) >= {"migration", "employment"}
    assert e.tagger.topics("What is the capital of France?") == []
    assert e.tagger.topics("Is it safe in the second TRIMESTER?") == ["pregnancy"]  # case and endings


def test_the_strictest_matching_topic_rule_applies():
    e = engine(profiles={"general": {"threshold": 0.5, "topics": {
        "pregnancy": {"threshold": 0.3, "action": "annotate"}, "healthcare": {"threshold": 0.3, "action": "block"},
        "finance": {"threshold": 0.4}}}})
    rag = RagInput(question="Which dose of ibuprofen is allowed in pregnancy, and does insurance pay?", passages=[])
    assert e.topic_for("general", rag) == "healthcare"  # same threshold as pregnancy, stronger action
    assert e.topic_for("general", rag, requested="Finance ") == "healthcare"  # a request cannot loosen policy
    calm = RagInput(question="Opening hours?", passages=[])
    assert e.topic_for("general", calm, requested="Finance ") == "finance"  # ... but can tighten it (cleaned)
    assert e.topic_for("general", calm, requested="made-up") == "general"  # only configured topics count
    assert e.topic_for("general", RagInput(question="Hello", passages=[])) == "general"


def test_route_rules_need_every_condition_and_the_first_match_wins():
    e = engine(profiles={"general": {}, "a": {}, "b": {}},
               routes=[{"profile": "a", "models": ["gpt-4*"], "headers": {"x-team": "care"}},
                       {"profile": "b", "api_keys": ["key-b"]}])
    assert e.profile_for(RequestFacts(model="gpt-4o", headers={"x-team": "care"})) == "a"
    assert e.profile_for(RequestFacts(model="gpt-4o")) == "general"
    assert e.profile_for(RequestFacts(api_key="key-b", model="gpt-4o", headers={"x-team": "care"})) == "a"
    assert e.profile_for(RequestFacts(api_key="key-b")) == "b"
    assert e.profile_for(RequestFacts(requested_profile="b")) == "general"  # not allowed unless configured


def test_request_override_only_when_enabled_and_only_known_profiles():
    e = engine(profiles={"general": {}, "b": {}}, request_override=True)
    assert e.profile_for(RequestFacts(requested_profile="b")) == "b"
    assert e.profile_for(RequestFacts(requested_profile="nope")) == "general"


def test_config_rejects_unknown_profiles_and_topics():
    with pytest.raises(ValueError, match="no profile named 'x'"):
        PolicySettings.model_validate({"routes": [{"profile": "x"}]})
    with pytest.raises(ValueError, match="unknown topic 'astrology'"):
        PolicySettings.model_validate({"profiles": {"general": {"topics": {"astrology": {"threshold": 0.1}}}}})


def test_decision_uses_the_policy_threshold_not_the_detectors():
    e = engine()
    detection = Detection(detector="combined", score=0.22, threshold=0.5, flagged=False)
    assert e.decide("general", "legal", Finding(detection)).flagged  # the sensitive topic's 0.175
    assert not e.decide("general", "general", Finding(detection)).flagged  # the profile's 0.3


def test_highlight_merges_overlapping_spans_and_skips_unplaced_factoids():
    text = "Alpha beta gamma delta."
    factoids = [Factoid(text="a", start=0, end=10, score=1), Factoid(text="b", start=6, end=16, score=1),
                Factoid(text="c", score=1)]
    assert actions.highlight(text, factoids, "<", ">") == "<Alpha beta gamma> delta."


def test_cite_quotes_sources_for_the_first_flagged_statements_and_counts_the_rest():
    """Each citation is looked up over the whole context, and an answer can carry thousands of flagged sentences
    (4,000 took 54 s, on the proxy's event loop, before the cap)."""
    context = [" ".join(f"Kettle {i} is safe for adults." for i in range(4_000))]
    flagged = [Factoid(text=f"Kettle {i} is cheap in Paris.", score=1) for i in range(4_000)]
    lines = actions.citations(flagged, context).splitlines()
    quoted = [line for line in lines if line.startswith('- "')]
    assert len(quoted) == actions.MAX_CITATIONS
    assert quoted[3] == '- "Kettle 3 is cheap in Paris.": source [1] says "Kettle 3 is safe for adults."'
    assert lines[-1] == f"- and {4_000 - actions.MAX_CITATIONS} more flagged statements, listed in the verdict."
    assert actions.citations(flagged[:2], ["Paracetamol is widely used."]).splitlines()[-1] == (
        '- "Kettle 1 is cheap in Paris.": no retrieved source supports this.')


def cited(answer: str, factoids: list[Factoid], passages: list[str], **message: object) -> str:
    """The answer's text after `cite`, with `factoids` flagged."""
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer, **message}}]}
    decision = Decision(profile="general", topic="general", threshold=0.3, flagged=True, action="cite")
    detection = Detection(detector="sentences", score=1.0, threshold=0.3, flagged=True, factoids=factoids)
    out = actions.apply(completion, decision, detection, passages, PolicySettings())
    return str(out["choices"][0]["message"]["content"]).removeprefix(answer)


def phrase(answer: str, text: str, after: int = 0) -> Factoid:
    start = answer.index(text, after)
    return Factoid(text=text, start=start, end=start + len(text), score=1.0, label="unsupported")


def test_cite_looks_up_a_flagged_phrase_by_the_sentence_it_stands_in():
    """The judge of `sentences` names a phrase ("in 1999"); the context says nothing of the phrase alone, but of its
    sentence it does."""
    answer = "Paris is in France. The Louvre opened its glass pyramid in 1999, a year after the expansion."
    passages = ["The Louvre opened its glass pyramid to visitors in 1989."]
    assert cited(answer, [phrase(answer, "in 1999"), phrase(answer, "a year after")], passages).splitlines() == [
        "", "", "Checked against the sources:",
        '- "The Louvre opened its glass pyramid in 1999, a year after the expansion." (flagged: "in 1999", '
        '"a year after"): source [1] says "The Louvre opened its glass pyramid to visitors in 1989."']
    # a whole sentence, an unplaced claim and offsets outside the answer are looked up by their own words
    whole = phrase(answer, "Paris is in France.")
    stray = Factoid(text="The Louvre opened", start=500, end=517, score=1.0)
    assert cited(answer, [whole, Factoid(text="in 1999", score=1.0), stray], passages).splitlines()[3:] == [
        '- "Paris is in France.": no retrieved source supports this.',
        '- "in 1999": no retrieved source supports this.',
        '- "The Louvre opened": source [1] says "The Louvre opened its glass pyramid to visitors in 1989."']


def test_cite_finds_the_sentence_of_a_phrase_in_a_tool_call_by_the_checked_text():
    answer = "Here is the booking."
    arguments = '{"note": "The museum opened in 1999."}'
    checked = answer + "\n\n" + arguments  # the offsets are in what the check read: the prose, then the arguments
    flagged = phrase(checked, "in 1999")
    lines = cited(answer, [flagged], ["The museum opened in 1989."],
                  tool_calls=[{"id": "c1", "type": "function", "function": {"name": "book", "arguments": arguments}}])
    assert lines.splitlines()[3] == ('- "{"note": "The museum opened in 1999."}" (flagged: "in 1999"): '
                                     'source [1] says "The museum opened in 1989."')


def test_audit_hashes_text_by_default_and_filters(tmp_path):
    # by default flagged answers keep their text for review (tests/review); without that, everything is hashed
    store = audit.AuditStore(AuditSettings(path=str(tmp_path / "a.db"), keep_text="none"))
    base = DecisionRecord(request_id="r1", profile="general", topic="legal", checked=True, score=0.7, threshold=0.3,
                          flagged=True, action="annotate", answer="secret answer")
    store.record(base)
    store.record(base.model_copy(update={"request_id": "r2", "flagged": False, "topic": "general"}))
    rows = store.query(flagged=True)
    assert [r["request_id"] for r in rows] == ["r1"]
    assert rows[0]["answer"].startswith("sha256:") and "secret" not in rows[0]["answer"]
    assert [r["request_id"] for r in store.query(topic="general")] == ["r2"]
    assert store.query(since=audit.parse_time("1h"), until=audit.parse_time("2999-01-01")) != []
    assert store.query(until=audit.parse_time("2000-01-01")) == []
    store.close()
    mode = sqlite3.connect(tmp_path / "a.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
