"""Fast-check switches: batched mutations and verifications, the verdict cache, rule-based antonyms,
and what batching saves in input tokens (a token-counting scripted judge)."""

import asyncio
import json
import re

import pytest

from morphguard.detectors import build_detector
from morphguard.detectors.relations import negate
from morphguard.eval import datasets
from morphguard.eval.items import Item
from morphguard.models import RagInput, VariantKind
from tests.detectors.scripted_judge import _tag
from tests.scripted_llm import ScriptedLLM, completion

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
TRUE_FACT = "Ibuprofen is contraindicated in the third trimester."
FALSE_FACT = "Ibuprofen is safe throughout pregnancy."
ANSWER = f"{TRUE_FACT} Otherwise {FALSE_FACT[0].lower()}{FALSE_FACT[1:]}"


def supported(statement: str) -> bool:
    """A perfect verifier for the two facts; antonyms start with 'A', synonyms with 'S'."""
    return (TRUE_FACT in statement or "trimester" in statement and "not" not in statement) != statement.startswith("A")


def counting_judge(factoids_of, verdict_of=supported):
    """Answers every MetaRAG prompt, single or batched; reports prompt tokens as characters / 4."""
    def reply(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        if "atomic factoids" in system:
            text = json.dumps({"factoids": factoids_of(_tag(user, "answer"))})
        elif "variants of factual statements" in system:
            n = int(re.search(r"write:\n- \"synonyms\": (\d+)", system).group(1))
            statements = re.findall(r"^\d+\. (.*)$", _tag(user, "statements"), re.M)
            text = json.dumps({"items": [{"synonyms": [f"S{i}: {s}" for i in range(1, n + 1)],
                                          "antonyms": [f"A{i}: {s}" for i in range(1, n + 1)]} for s in statements]})
        elif "paraphrases" in system or "contradictions" in system:
            n = int(re.search(r"write (\d+) different", system).group(1))
            prefix = "S" if "paraphrases" in system else "A"
            text = json.dumps({"statements": [f"{prefix}{i}: {_tag(user, 'statement')}" for i in range(1, n + 1)]})
        elif "<statements>" in user and "reference passages" in system:
            statements = re.findall(r"^\d+\. (.*)$", _tag(user, "statements"), re.M)
            text = json.dumps({"verdicts": ["YES" if verdict_of(s) else "NO" for s in statements]})
        else:
            text = json.dumps({"verdict": "YES" if verdict_of(_tag(user, "statement")) else "NO"})
        return completion(text, prompt_tokens=tokens, completion_tokens=len(text) // 4)
    return reply


def configured(scripted_config, base_url, **metarag):
    config = scripted_config(base_url, **metarag)
    return config.model_copy(update={"judge": config.judge.model_copy(
        update={"cache": config.judge.cache.model_copy(update={"enabled": False})})})


def check(detector, answer=ANSWER, passages=(PASSAGE,), question=QUESTION):
    return asyncio.run(detector.detect(RagInput(question=question, passages=list(passages)), answer))


def test_batched_profile_makes_three_calls_and_scores_like_the_faithful_one(scripted_config):
    judge = counting_judge(lambda answer: [TRUE_FACT, FALSE_FACT])
    with ScriptedLLM(judge) as server:
        faithful = check(build_detector(configured(scripted_config, server.base_url), name="metarag:paper"))
        calls_faithful = len(server.requests)
        batched = check(build_detector(configured(scripted_config, server.base_url), name="metarag:batched"))
        calls_batched = len(server.requests) - calls_faithful
    assert calls_faithful == 1 + 2 * 2 + 2 * 4 and calls_batched == 3
    assert [f.score for f in batched.factoids] == [f.score for f in faithful.factoids] == [0.0, 1.0]
    assert [v.kind for v in batched.factoids[0].variants] == [VariantKind.SYNONYM] * 2 + [VariantKind.ANTONYM] * 2
    assert batched.cost.stages["verify"].llm_calls == 1


def test_verify_per_factoid_batches(scripted_config):
    with ScriptedLLM(counting_judge(lambda answer: [TRUE_FACT, FALSE_FACT])) as server:
        result = check(build_detector(configured(scripted_config, server.base_url, batch_verify="factoid"),
                                      name="metarag:paper"))
    assert result.cost.stages["verify"].llm_calls == 2 and result.score == 1.0


def test_the_verdict_cache_answers_repeated_statements_across_checks(scripted_config):
    with ScriptedLLM(counting_judge(lambda answer: [TRUE_FACT, FALSE_FACT])) as server:
        detector = build_detector(configured(scripted_config, server.base_url), name="metarag:paper")
        first = check(detector)
        second = check(detector)
        off = check(build_detector(configured(scripted_config, server.base_url, verdict_cache=0), name="metarag:paper"))
    assert first.cost.stages["verify"].llm_calls == 8
    assert second.cost.stages["verify"].llm_calls == 0 and second.score == first.score
    assert second.cost.stages["verify"].cached_calls == 8
    assert off.cost.stages["verify"].llm_calls == 8


def test_rule_antonyms_replace_the_antonym_call_where_a_rule_applies(scripted_config):
    dated = "The third trimester starts in week 28."
    with ScriptedLLM(counting_judge(lambda answer: [dated, "Ibuprofen helps with pain."])) as server:
        result = check(build_detector(configured(scripted_config, server.base_url, rule_antonyms=True),
                                      name="metarag:paper"), answer=dated + " Ibuprofen helps with pain.")
        antonym_calls = sum("contradictions" in r["messages"][0]["content"] for r in server.requests)
    assert antonym_calls == 1  # only "helps with pain" needed the judge
    dated_antonyms = [v.text for v in result.factoids[0].variants if v.kind is VariantKind.ANTONYM]
    assert dated_antonyms == ["The third trimester starts in week 57."]


@pytest.mark.parametrize("statement, negated", [
    ("The tower was completed in 1889.", "The tower was completed in 1896."),
    ("It has 3 floors.", "It has 7 floors."),
    ("Ibuprofen is safe throughout pregnancy.", "Ibuprofen is not safe throughout pregnancy."),
    ("Ibuprofen is not safe.", "Ibuprofen is safe."),
    ("It isn't safe.", "It is safe."),
    ("Paris hosts it.", None),
])
def test_negation_rules(statement, negated):
    assert negate(statement) == negated


def qa_items():
    try:
        return datasets.sample(datasets.load("ragtruth-qa"), 24, seed=0)
    except datasets.DatasetError:  # without the shared data: three long-context stand-ins
        context = [" ".join(f"Sentence {i} of passage {p} says something specific." for i in range(12))
                   for p in range(3)]
        return [Item(id=str(i), task="QA", question="What do the passages say?", passages=context,
                              answer=" ".join(f"Claim {j} is stated." for j in range(6)), hallucinated=False)
                for i in range(3)]


def test_batching_sends_under_a_fifth_of_the_faithful_input_tokens(scripted_config):
    """The issue's bar: on the 24 RAGTruth QA items (seed 0), batched ≤ 1/5 of faithful input tokens."""
    split = lambda answer: [s.strip() for s in re.split(r"(?<=[.!?])\s+", answer) if s.strip()][:16]  # noqa: E731
    totals = {}
    with ScriptedLLM(counting_judge(split, verdict_of=lambda s: True)) as server:
        for profile in ("paper", "batched"):
            detector = build_detector(configured(scripted_config, server.base_url), name=f"metarag:{profile}")
            totals[profile] = sum(check(detector, item.answer, item.passages, item.question).cost.input_tokens
                                  for item in qa_items())
    assert totals["batched"] * 5 <= totals["paper"], totals


def test_embedded_profile_makes_one_call_on_the_answer_sentences(scripted_config):
    answer = f"Based on the passages, here is what they say:\n\n* {TRUE_FACT}\n* {FALSE_FACT}\n\nI hope this helps."
    with ScriptedLLM(counting_judge(lambda answer: pytest.fail("no decompose call expected"))) as server:
        result = check(build_detector(configured(scripted_config, server.base_url), name="metarag:embedded"),
                       answer=answer)
        requests = list(server.requests)
    assert len(requests) == 1 and result.cost.llm_calls == 1
    assert [f.text for f in result.factoids] == [TRUE_FACT, FALSE_FACT]
    assert [answer[f.start:f.end] for f in result.factoids] == [TRUE_FACT.rstrip("."), FALSE_FACT.rstrip(".")]
    assert [[v.kind for v in f.variants] for f in result.factoids] == [[VariantKind.IDENTITY]] * 2
    assert [f.score for f in result.factoids] == [0.0, 1.0] and result.flagged


def test_rule_antonyms_need_no_llm_mutations(scripted_config):
    truths = {TRUE_FACT, "Ibuprofen is not safe throughout pregnancy."}
    with ScriptedLLM(counting_judge(lambda answer: [], verdict_of=truths.__contains__)) as server:
        result = check(build_detector(configured(scripted_config, server.base_url, rule_antonyms=True),
                                      name="metarag:embedded"), answer=f"{TRUE_FACT} {FALSE_FACT}")
        calls = len(server.requests)
    assert calls == 1  # the facts and their rule antonyms in one verify call
    assert [[v.kind for v in f.variants] for f in result.factoids] == [[VariantKind.IDENTITY, VariantKind.ANTONYM]] * 2
    assert result.factoids[1].variants[1].text == "Ibuprofen is not safe throughout pregnancy."
    assert [f.score for f in result.factoids] == [0.0, 1.0]


def test_embedded_profile_verifies_against_the_relevant_part_of_a_long_context(scripted_config):
    filler = [f"The clinic car park on level {i} opens at seven." for i in range(60)]
    passages = [" ".join(filler[:30]), " ".join(filler[30:] + [PASSAGE])]
    with ScriptedLLM(counting_judge(lambda answer: [])) as server:
        check(build_detector(configured(scripted_config, server.base_url), name="metarag:embedded"),
              answer=TRUE_FACT, passages=passages)
        sent = _tag(server.requests[0]["messages"][-1]["content"], "passages")
    assert PASSAGE in sent and len(sent) <= 1000 + 40
    assert sum(len(p) for p in passages) > 2 * len(sent)
