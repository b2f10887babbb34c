"""Rules as plugins: a team's own rule registered beside the built-in ones flags through `grounding` and `combined`;
the core reads a context with no rule at all; every rule's version is in the fingerprints."""

import asyncio
import json
import re
from collections.abc import Iterator

import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector, fingerprint
from morphguard.detectors import rules as rules_package
from morphguard.detectors.rules import RULES, Conflict, Context, Reading, Rule, read_all, register
from morphguard.detectors.rules import registry as rules_registry
from morphguard.models import Evidence, RagInput
from tests.scripted_llm import ScriptedLLM, completion

LEAFLET = ("Take 1 or 2 tablets at a time. Wait at least 4 hours between doses. "
           "Never take more than 8 tablets in 24 hours.")
# every word and number of it is the leaflet's own: counting unsupported words sees nothing wrong
OVERDOSE = "Take 2 tablets every hour."
DAILY_MOST = re.compile(r"more than (\d+) tablets in 24 hours")
DOSE = re.compile(r"(\d+) tablets every (?:(\d+) )?hours?")


def _dosage(answer: str, context: Context) -> Reading:
    """A team's rule: a daily amount the answer implies above the most the leaflet allows."""
    most = next((m for p, passage in enumerate(context.passages, 1) if (m := DAILY_MOST.search(passage))), None)
    if most is None:
        return Reading()
    evidence = Evidence(passage=1, start=most.start(), end=most.end(), text=most.group())
    return Reading([Conflict(m.start(), m.end(), m.start(), "daily dose", evidence,
                             f"{_daily(m)} tablets a day: more than the leaflet's {most[1]}")
                    for m in DOSE.finditer(answer) if _daily(m) > int(most[1])])


def _daily(dose: re.Match[str]) -> int:
    return int(dose[1]) * 24 // int(dose[2] or 1)


@pytest.fixture
def dosage() -> Iterator[Rule]:
    rule = register(Rule(name="dosage", read=_dosage))
    yield rule
    RULES.pop(rule.name)


def grounded(passages: list[str], answer: str):
    detector = build_detector(Config(), name="grounding")
    return asyncio.run(detector.detect(RagInput(question="How many tablets?", passages=passages), answer))


def test_the_built_in_rules_are_registered_by_being_in_the_package():
    assert {"records", "hours"} <= set(RULES)
    assert rules_package.RULES is RULES


def test_a_teams_own_rule_flags_what_counting_words_cannot_see(dosage):
    found = read_all(OVERDOSE, [LEAFLET]).conflicts
    assert [(c.fact, OVERDOSE[c.start:c.end]) for c in found] == [("daily dose", "2 tablets every hour")]
    result = grounded([LEAFLET], OVERDOSE)
    assert result.flagged and result.features["record_conflicts"] == 1
    assert result.settings["unsupported_words"] == []
    [factoid] = result.factoids
    assert factoid.label == "contradicted" and factoid.reason == "48 tablets a day: more than the leaflet's 8"
    assert factoid.evidence[0].text == "more than 8 tablets in 24 hours"
    assert read_all("Take 2 tablets every 6 hours.", [LEAFLET]).conflicts == []


def test_without_the_rule_the_same_answer_passes(dosage):
    RULES.pop("dosage")
    try:
        result = grounded([LEAFLET], OVERDOSE)
    finally:
        RULES["dosage"] = dosage
    assert not result.flagged and result.factoids == [] and result.features["record_conflicts"] == 0


def test_the_core_reads_a_record_with_no_rule_registered_as_prose(monkeypatch):
    record = json.dumps({"name": "Harbour Deli", "attributes": {"OutdoorSeating": False}})
    answer = "Harbour Deli offers outdoor seating."
    with_rules = grounded([record], answer)
    assert with_rules.features["record_fields"] == 1 and with_rules.features["record_conflicts"] == 1
    monkeypatch.setattr(rules_registry, "RULES", {})
    bare = grounded([record], answer)
    assert bare.features["record_fields"] == 0 and bare.features["record_conflicts"] == 0
    assert not [f for f in bare.factoids if f.label == "contradicted"]
    assert bare.features["content_words"] == with_rules.features["content_words"]  # the words are still counted


def test_each_rules_version_is_in_the_fingerprints_of_the_detectors_that_read_rules(monkeypatch):
    config = Config()
    shipped = {name: fingerprint(config, name) for name in ("grounding", "combined", "direct")}
    assert rules_registry.fingerprint() == {"records": rules_registry.RULES["records"].version}
    register(Rule(name="dosage", read=_dosage, version=3))
    try:
        with_dosage = {name: fingerprint(config, name) for name in shipped}
    finally:
        RULES.pop("dosage")
    assert with_dosage["grounding"] != shipped["grounding"] and with_dosage["combined"] != shipped["combined"]
    assert with_dosage["direct"] == shipped["direct"]  # reads no rule


def test_a_rule_is_registered_once_and_rules_versioned_together_agree(dosage):
    with pytest.raises(ValueError, match="registered twice"):
        register(Rule(name="dosage", read=_dosage))
    with pytest.raises(ValueError, match="differs"):
        register(Rule(name="dates", read=_dosage, version=9, versioned_as="records"))
    assert "dates" not in RULES


def test_a_reading_shared_by_rules_is_made_once_per_check():
    made = []

    def parse(passages: list[str]) -> int:
        made.append(passages)
        return len(passages)

    context = Context(["a", "b"])
    assert context.shared(parse) == 2 and context.shared(parse) == 2 and len(made) == 1
    assert Context(["a"]).shared(parse) == 1 and len(made) == 2


def test_the_combined_check_scores_a_teams_rule_on_a_record_without_asking_the_judge(scripted_config):
    """Over a context of records alone the combined check asks no judge; the rules' conflicts are its evidence
    (the `misread` channel), so a conflict the team's rule finds raises the answer's probability."""
    record = json.dumps({"product": "Pain relief 500", "ForChildren": False, "leaflet": LEAFLET})
    answer = "Pain relief 500: take 2 tablets every hour."
    rag = RagInput(question="How many?", passages=[record])
    with ScriptedLLM(lambda body: completion("NO")) as server:
        config = scripted_config(server.base_url)
        plain = asyncio.run(build_detector(config, name="combined").detect(rag, answer))
        register(Rule(name="dosage", read=_dosage))
        try:
            ruled = asyncio.run(build_detector(config, name="combined").detect(rag, answer))
        finally:
            RULES.pop("dosage")
    assert server.requests == [] and plain.settings["record"] and ruled.settings["record"]
    assert plain.features["record_conflicts"] == 0 < ruled.features["record_conflicts"]
    assert ruled.score > plain.score
    assert [f.reason for f in ruled.factoids if f.label == "contradicted"] == [
        "48 tablets a day: more than the leaflet's 8"]
