"""The length baseline and the one-call direct judge, through the real client and a scripted server."""

import asyncio
import json
import math

import pytest

from morphguard.detectors import build_detector
from morphguard.detectors.baselines import DirectJudge
from morphguard.llm import build_client
from morphguard.models import RagInput
from tests.detectors.scripted_judge import stage_of
from tests.scripted_llm import ScriptedLLM, completion

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen?"
ANSWER = "Ibuprofen is contraindicated late in pregnancy. It is safe in the first two trimesters."


def verdict_tokens(verdict: str, p_no: float) -> list[dict]:
    """Log-probabilities as llama.cpp returns them: the verdict token carries YES/NO alternatives."""
    head = [{"token": t, "logprob": -0.01, "bytes": None, "top_logprobs": []} for t in ('{"', "verdict", '":"')]
    pick = {"token": verdict, "logprob": math.log(p_no if verdict == "NO" else 1 - p_no), "bytes": None,
            "top_logprobs": [{"token": "NO", "logprob": math.log(p_no), "bytes": None},
                             {"token": "YES", "logprob": math.log(1 - p_no), "bytes": None}]}
    return [*head, pick, {"token": '", ...', "logprob": -0.01, "bytes": None, "top_logprobs": []}]


def run(detector, answer=ANSWER):
    return asyncio.run(detector.detect(RagInput(question=QUESTION, passages=[PASSAGE]), answer))


def test_direct_scores_by_the_probability_of_no_and_maps_unsupported_parts(scripted_config):
    text = json.dumps({"verdict": "NO", "unsupported": ["It is safe in the first two trimesters"]},
                      separators=(",", ":"))
    with ScriptedLLM(lambda body: completion(text, logprobs=verdict_tokens("NO", 0.7))) as server:
        result = run(build_detector(scripted_config(server.base_url), name="direct"))
    assert len(server.requests) == 1 and stage_of(server.requests[0]) == "direct"
    # passages come first (a shared cacheable prefix), the answer last
    user = server.requests[0]["messages"][-1]["content"]
    assert user.index(PASSAGE) < user.index(ANSWER)
    assert result.detector == "direct"
    assert result.score == pytest.approx(0.7) and result.flagged
    (factoid,) = result.factoids
    assert ANSWER[factoid.start:factoid.end] == "It is safe in the first two trimesters"
    assert result.cost.llm_calls == 1 and result.cost.input_tokens == 11 and result.cost.output_tokens == 7


def test_direct_without_logprobs_scores_the_discrete_verdict(scripted_config):
    with ScriptedLLM(lambda body: json.dumps({"verdict": "YES", "unsupported": ["ignored when YES"]})) as server:
        result = run(build_detector(scripted_config(server.base_url), name="direct"))
    assert result.score == 0.0 and not result.flagged and result.factoids == []


def test_direct_counts_an_unreadable_reply_as_undecided(scripted_config):
    with ScriptedLLM(lambda body: "I cannot tell.") as server:
        result = run(build_detector(scripted_config(server.base_url), name="direct"))
    assert result.score == 0.5 and result.stats.unparseable_verdicts == 1


def test_length_baseline_grows_with_the_answer_and_calls_nothing(scripted_config):
    detector = build_detector(scripted_config("http://127.0.0.1:9/v1"), name="length")
    short, long = run(detector, "Yes."), run(detector, "word " * 150)
    assert 0 < short.score < long.score < 1
    assert long.flagged and not short.flagged
    assert short.cost.llm_calls == 0


def test_profiles_are_chosen_by_name(scripted_config):
    config = scripted_config("http://127.0.0.1:9/v1")
    paper = build_detector(config, name="metarag:paper")
    embedded = build_detector(config, name="metarag:embedded")
    assert paper.name == "metarag:paper" and paper.options.n_mutations == 2
    assert embedded.options.identity and embedded.options.n_mutations == 0 and embedded.options.decompose == "sentences"
    with pytest.raises(ValueError, match="unknown detector"):
        build_detector(config, name="nope")
    with pytest.raises(ValueError, match="unknown profile"):
        build_detector(config, name="direct:paper")


def test_direct_reads_at_most_its_context_budget_the_sentences_about_the_answer_first(scripted_config):
    passages = ["Filler about the weather. " * 40 + "Ibuprofen is contraindicated in the third trimester.",
                "More filler on gardens. " * 40]
    with ScriptedLLM(lambda body: json.dumps({"verdict": "YES", "unsupported": []})) as server:
        judge = DirectJudge(build_client(scripted_config(server.base_url)), context_budget=200)
        asyncio.run(judge.detect(RagInput(question="Ibuprofen?", passages=passages),
                                 "Ibuprofen is contraindicated in the third trimester."))
    sent = server.requests[0]["messages"][-1]["content"].split("<passages>")[1].split("</passages>")[0]
    assert "Ibuprofen is contraindicated in the third trimester." in sent
    assert len(sent) < 300 and "gardens" not in sent
