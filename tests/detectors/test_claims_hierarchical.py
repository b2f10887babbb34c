"""The claim judge and the hierarchical verifier through the real client and a scripted judge."""

import asyncio
import json
import re

import pytest

from morphguard.detectors import build_detector
from morphguard.detectors.claims import ClaimsSettings
from morphguard.detectors.hierarchical import HierarchicalSettings, and_join, or_join, windows
from morphguard.models import RagInput
from tests.scripted_llm import ScriptedLLM

PASSAGES = ["The Eiffel Tower is in Paris. It was completed in 1889.", "It is 330 metres tall."]
QUESTION = "Tell me about the Eiffel Tower."
ANSWER = "The Eiffel Tower is in Paris. It was completed in 1925. It is painted gold."


def run(detector, answer=ANSWER, passages=PASSAGES):
    return asyncio.run(detector.detect(RagInput(question=QUESTION, passages=passages), answer))


def claims_reply(claims):
    return lambda body: json.dumps({"claims": claims})


def test_claim_labels_spans_and_evidence(scripted_config):
    reply = claims_reply([
        {"text": "The Eiffel Tower is in Paris", "label": "supported", "evidence": "The Eiffel Tower is in  paris"},
        {"text": "It was completed in 1925", "label": "contradicted", "evidence": "completed in 1889"},
        {"text": "It is painted gold", "label": "unsupported", "evidence": ""},
    ])
    with ScriptedLLM(reply) as server:
        result = run(build_detector(scripted_config(server.base_url), name="claims"))
    assert len(server.requests) == 1
    paris, date, gold = result.factoids
    assert (paris.label, paris.score, date.label, gold.label) == ("supported", 0.0, "contradicted", "unsupported")
    assert paris.evidence[0].passage == 1 and paris.evidence[0].text == "The Eiffel Tower is in Paris"
    assert date.evidence[0].text == "completed in 1889"
    assert ANSWER[gold.start:gold.end] == "It is painted gold"
    assert result.score == 1.0 and result.flagged


def test_supported_without_evidence_in_the_context_is_downgraded(scripted_config):
    reply = claims_reply([{"text": "The Eiffel Tower is in Paris", "label": "supported",
                           "evidence": "everyone knows this"}])
    with ScriptedLLM(reply) as server:
        result = run(build_detector(scripted_config(server.base_url), name="claims"), answer="It is in Paris.")
    (claim,) = result.factoids
    assert claim.label == "unsupported" and result.stats.downgraded_claims == 1 and result.flagged


def test_compound_claims_are_reasked_once_with_a_sharper_instruction(scripted_config):
    def reply(body):
        sharper = "split at every 'and'" in body["messages"][0]["content"]
        if not sharper:
            return json.dumps({"claims": [{"text": "The tower is in Paris and it was completed in 1889",
                                           "label": "supported", "evidence": "completed in 1889"}]})
        return json.dumps({"claims": [
            {"text": "The tower is in Paris", "label": "supported", "evidence": "is in Paris"},
            {"text": "It was completed in 1889", "label": "supported", "evidence": "completed in 1889"}]})

    with ScriptedLLM(reply) as server:
        result = run(build_detector(scripted_config(server.base_url), name="claims"))
    assert len(server.requests) == 2 and [f.text for f in result.factoids] == [
        "The tower is in Paris", "It was completed in 1889"]
    assert result.score == 0.0


def test_rate_aggregation_and_long_contexts_judged_per_passage(scripted_config):
    def reply(body):
        system = body["messages"][0]["content"]
        if "split an answer into atomic claims" in system:
            return json.dumps({"claims": ["It is in Paris", "It is 330 metres tall"]})
        passage = re.search(r"\[1\] (.*?)\n</passages>", body["messages"][-1]["content"], re.S).group(1)
        if "Paris" in passage:
            return json.dumps({"labels": [{"label": "supported", "evidence": "is in Paris"},
                                          {"label": "unsupported", "evidence": ""}]})
        return json.dumps({"labels": [{"label": "unsupported", "evidence": ""},
                                      {"label": "contradicted", "evidence": "330 metres"}]})

    config = scripted_config("x")
    with ScriptedLLM(reply) as server:
        config = scripted_config(server.base_url)
        config = config.with_section("claims", ClaimsSettings(max_context_chars=500, aggregate="rate"))
        long_passages = [PASSAGES[0] + " " + "Filler text. " * 40, PASSAGES[1]]
        result = run(build_detector(config, name="claims"), passages=long_passages)
    assert len(server.requests) == 3  # one extraction, one labelling per passage
    paris, height = result.factoids
    assert paris.label == "supported" and paris.evidence[0].passage == 1
    assert height.label == "contradicted" and height.evidence[0].passage == 2  # any passage contradicting wins
    assert result.score == 0.5


def test_window_ranges_and_the_joins():
    assert windows(10, 25, 10) == [range(0, 10)]
    assert windows(40, 25, 10) == [range(0, 25), range(15, 40)]
    assert windows(5, 2, 1) == [range(0, 2), range(1, 3), range(2, 4), range(3, 5)]
    assert or_join(["baseless", "entailed", "contradicted"]) == "contradicted"
    assert or_join(["baseless", "entailed"]) == "entailed" and or_join(["baseless"]) == "baseless"
    assert and_join(["entailed", "baseless"]) == "baseless" and and_join(["entailed"]) == "entailed"


def hierarchical_judge(seen):
    """Decompose a sentence into itself; verify by rule: 1889/Paris entailed (citing the sentence that says
    so), 1925 contradicted where 1889 is visible, everything else baseless."""
    def reply(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "split one sentence" in system:
            sentence = re.search(r"<sentence>\n(.*?)\n</sentence>", user, re.S).group(1)
            return json.dumps({"claims": [sentence.rstrip(".")]})
        seen.append(user)
        listed = dict(re.findall(r"\[(\d+)\] (.*)", user.split("</sentences>")[0]))
        claim = re.search(r"<claim>\n(.*?)\n</claim>", user, re.S).group(1)
        find = lambda word: [int(n) for n, text in listed.items() if word in text]  # noqa: E731
        if "Paris" in claim and find("Paris"):
            return json.dumps({"label": "entailed", "evidence": find("Paris")})
        if "1925" in claim and find("1889"):
            return json.dumps({"label": "contradicted", "evidence": find("1889")})
        return json.dumps({"label": "baseless", "evidence": []})
    return reply


def test_hierarchical_local_windows_then_global_with_hint(scripted_config):
    seen: list[str] = []
    passages = [" ".join(f"Fact number {i} is dull." for i in range(6)) + " The tower is in Paris.",
                "It was completed in 1889."]
    with ScriptedLLM(hierarchical_judge(seen)) as server:
        config = scripted_config(server.base_url)
        config = config.with_section("hierarchical", HierarchicalSettings(window=4, overlap=1, soft_verdicts=False))
        result = run(build_detector(config, name="hierarchical"), passages=passages)
    # 8 context sentences, windows [1-4] [4-7] [7-8]: 3 local checks per claim, then one global check each
    assert result.settings["windows"] == 3
    assert len(seen) == 3 * (3 + 1)
    paris, date, gold = result.factoids
    assert (paris.label, date.label, gold.label) == ("supported", "contradicted", "unsupported")
    assert (paris.score, date.score, gold.score) == (0.0, 1.0, 1.0)
    assert date.evidence[0].text == "It was completed in 1889." and date.evidence[0].passage == 2
    assert ANSWER[date.start:date.end] == "It was completed in 1925"
    global_date = [u for u in seen if "<hint>" in u and "1925" in u][0]
    assert "found the claim contradicted, citing sentences 8." in global_date
    assert result.settings["answer_label"] == "contradicted" and result.flagged


def test_hierarchical_single_window_needs_no_global_pass(scripted_config):
    seen: list[str] = []
    with ScriptedLLM(hierarchical_judge(seen)) as server:
        result = run(build_detector(scripted_config(server.base_url), name="hierarchical"),
                     answer="The Eiffel Tower is in Paris.")
    assert len(seen) == 1 and "<hint>" not in seen[0]
    (claim,) = result.factoids
    assert claim.label == "supported" and claim.evidence[0].text == "The Eiffel Tower is in Paris."
    assert not result.flagged


@pytest.mark.parametrize("name", ["claims", "hierarchical"])
def test_unreadable_replies_do_not_crash(scripted_config, name):
    with ScriptedLLM(lambda body: "no json here") as server:
        result = run(build_detector(scripted_config(server.base_url), name=name))
    assert 0.0 <= result.score <= 1.0
