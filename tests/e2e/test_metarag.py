"""MetaRAG through the running proxy, pinned (`detector.name: metarag`): the other suites run the default
(`auto`, which is `sentences` with an API judge). The scripted provider answers MetaRAG's stages by its lexical
rule: one factoid per answer, two paraphrases and two contradictions of it, each verified against the passages."""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.conftest import audit_row

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
ASYLUM_PASSAGE = "Refugees may receive protection after their asylum claim has been assessed."


@pytest.fixture(scope="module")
def metarag_proxy(proxy_factory) -> str:
    return proxy_factory(detector="metarag", policy={"audit": {"store_text": "full"},
                                                     "profiles": {"general": {"action": "annotate", "topics": {}},
                                                                  "cite": {"action": "cite", "topics": {}}},
                                                     "routes": [{"profile": "cite", "path_prefix": "/cite"}]})


def check(base: str, model: str, passage: str = PASSAGE, question: str = QUESTION, stream: bool = False):
    client = openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=30)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}], stream=stream,
        extra_body={"morphguard": {"context": [passage]}})


def test_a_hallucination_is_flagged_as_its_one_factoid_after_every_stage(metarag_proxy, proxy_factory):
    raw = check(metarag_proxy, "hallucinated")
    verdict = raw.parse().model_extra["morphguard"]
    assert verdict["detector"] == "metarag" and verdict["flagged"] and verdict["score"] == 1.0
    [factoid] = verdict["factoids"]
    assert factoid["text"] == "Ibuprofen is safe throughout pregnancy." and factoid["flagged"]
    row = audit_row(proxy_factory, metarag_proxy, verdict["request_id"])
    assert row["detector"] == "metarag"
    # decompose, a paraphrase and a contradiction call, then four verifications
    cost = json.loads(row["cost"])
    assert cost["llm_calls"] + cost["cached_calls"] >= 7, cost


def test_a_faithful_answer_scores_zero(metarag_proxy):
    verdict = check(metarag_proxy, "faithful").parse().model_extra["morphguard"]
    assert verdict["detector"] == "metarag" and verdict["score"] == 0.0 and not verdict["flagged"]


def test_unsure_verdicts_make_a_fractional_score(metarag_proxy):
    """Three NOT SURE (0.5 each) and one NO on a contradiction (supported: 0): the mean is exactly 0.375."""
    verdict = check(metarag_proxy, "refugee", ASYLUM_PASSAGE, "Do refugees get protection?").parse() \
        .model_extra["morphguard"]
    assert verdict["detector"] == "metarag" and verdict["score"] == 0.375


def test_a_stream_ends_with_metarags_verdict(metarag_proxy):
    raw = check(metarag_proxy, "hallucinated", stream=True)
    chunks = list(raw.parse())
    verdict = chunks[-1].model_extra["morphguard"]
    assert verdict["detector"] == "metarag" and verdict["flagged"] and verdict["score"] == 1.0


def test_cite_names_the_source_of_a_flagged_factoid(metarag_proxy):
    content = check(metarag_proxy + "/cite", "hallucinated").parse().choices[0].message.content
    assert content.startswith("Ibuprofen is safe throughout pregnancy.\n\nChecked against the sources:")
    assert f'- "Ibuprofen is safe throughout pregnancy.": source [1] says "{PASSAGE}"' in content
