"""The verifier check in process: tiny ONNX models made in the test (tests/verifier_models.py) run through the real
loading, tokenising, windowing, batching and label mapping. They show the plumbing, not any model's accuracy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.registry import resolve_auto
from morphguard.detectors.verifier import VerifierCheck
from morphguard.errors import JudgeCallCapError, LLMError, MorphguardError
from morphguard.llm.client import call_budget
from morphguard.llm.onnx_model import OnnxVerifier
from morphguard.models import RagInput
from tests.verifier_models import save

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
FAITHFUL = "Ibuprofen is contraindicated in the third trimester."
WRONG = "Ibuprofen is safe throughout pregnancy."
# A context of many sentences: the fact the answer rests on is in its last one.
FILLER = [f"Note {n} describes the dosage schedule of paracetamol tablets." for n in range(12)]
LATE = "Aspirin thins the blood of adults."
WORDS = [PASSAGE, QUESTION, FAITHFUL, WRONG, *FILLER, LATE, "aspirin thins blood"]


@pytest.fixture(scope="module")
def claims_folder(tmp_path_factory) -> Path:
    return save(tmp_path_factory.mktemp("claims"), "claims", WORDS)


@pytest.fixture(scope="module")
def tokens_folder(tmp_path_factory) -> Path:
    from morphguard.detectors.verifier import TOKENS_PROMPT

    return save(tmp_path_factory.mktemp("tokens"), "tokens", [*WORDS, TOKENS_PROMPT, "passage"])


def judged(folder: Path | str, **settings: object) -> Config:
    """A config whose judge is the verifier in `folder`, run in process."""
    return Config.model_validate({"judge": {"runtime": "onnx", "model": str(folder)}, "verifier": settings})


def check(folder: Path, **settings: object) -> VerifierCheck:
    detector = build_detector(judged(folder, **settings))
    assert isinstance(detector, VerifierCheck)
    return detector


def run(detector: VerifierCheck, answer: str, passages: list[str], question: str = QUESTION):
    return asyncio.run(detector.detect(RagInput(question=question, passages=passages), answer))


def test_a_claim_classifier_scores_each_sentence_against_its_context(claims_folder):
    detector = check(claims_folder)
    found = run(detector, f"{FAITHFUL} {WRONG}", [PASSAGE])
    faithful, wrong = found.factoids
    assert (faithful.text, faithful.label) == (FAITHFUL, "supported")
    assert faithful.score == pytest.approx(1 - 0.8808, abs=1e-3)  # every word in the premise
    assert (wrong.text, wrong.label) == (WRONG, "unsupported")
    assert wrong.score == pytest.approx(1 - 0.0025, abs=1e-3)  # "safe" and "throughout" are not
    assert found.flagged and found.score == wrong.score
    assert wrong.evidence[0].text == PASSAGE and wrong.evidence[0].passage == 1
    assert str(claims_folder) in wrong.reason and "window 1 of 1" in wrong.reason
    assert found.settings["model"] == str(claims_folder) and found.features["worst"] == wrong.score
    (step,) = found.settings["explanation"]
    assert step["step"] == "verifier" and WRONG in step["text"] and "window 1 of 1" in step["text"]

    assert not run(detector, FAITHFUL, [PASSAGE]).flagged


def test_a_long_context_is_cut_into_windows_and_the_best_window_decides(claims_folder):
    # 24 tokens a window: one filler sentence (10 tokens) beside the claim (5) and the special tokens; the supporting
    # sentence is the last
    detector = check(claims_folder, max_tokens=24)
    passages = [" ".join([*FILLER, LATE])]
    found = run(detector, "Aspirin thins the blood.", passages)
    assert not found.flagged
    (factoid,) = found.factoids
    assert factoid.evidence[0].text == LATE
    assert passages[0][factoid.evidence[0].start:factoid.evidence[0].end] == LATE
    windows = int(factoid.reason.split(" of ")[1].split(" ")[0])
    assert windows > 1 and f"window {windows} of {windows}" in factoid.reason  # the last one decided
    assert found.settings["sequences"] == windows

    whole = run(check(claims_folder, max_tokens=512), "Aspirin thins the blood.", passages)
    assert "window 1 of 1" in whole.factoids[0].reason
    assert whole.score == pytest.approx(found.score)


def test_focus_keeps_only_the_relevant_sentences_of_a_context_beyond_the_budget(claims_folder):
    passages = [" ".join([*FILLER, LATE])]
    found = run(check(claims_folder, context_budget=200), "Aspirin thins the blood.", passages)
    assert found.factoids[0].evidence[0].text == LATE and "window 1 of 1" in found.factoids[0].reason


def test_batches_of_any_size_give_the_same_scores_and_count_as_calls(claims_folder):
    answer = f"{FAITHFUL} {WRONG} Aspirin thins the blood."
    passages = [PASSAGE, LATE]
    one, many = run(check(claims_folder, batch=1), answer, passages), run(check(claims_folder, batch=8), answer,
                                                                          passages)
    assert [f.score for f in one.factoids] == pytest.approx([f.score for f in many.factoids])
    # each sentence against one window holding both passages: 3 sequences, run one at a time or in one batch
    assert one.settings["sequences"] == many.settings["sequences"] == 3
    assert one.cost.llm_calls == 3 and many.cost.llm_calls == 1
    evidence = many.factoids[2].evidence
    assert [(e.passage, e.text) for e in evidence] == [(1, PASSAGE), (2, LATE)]
    assert "window 1 of 1 (passage 1, characters 0-65; passage 2, characters 0-34)" in many.factoids[2].reason


def test_a_check_past_its_cap_checks_the_first_sentences_that_fit_and_leaves_the_rest_unchecked(claims_folder,
                                                                                                  monkeypatch):
    detector = check(claims_folder, batch=1)
    ran = []
    monkeypatch.setattr(OnnxVerifier, "_supported", lambda self, texts: ran.append(texts) or [0.0] * len(texts))
    answer = f"{FAITHFUL} {WRONG} Aspirin thins the blood."

    async def capped(cap: int):
        with call_budget(cap):
            return await detector.detect(RagInput(question=QUESTION, passages=[PASSAGE]), answer)

    found = asyncio.run(capped(2))
    assert sum(map(len, ran)) == 2 and [f.text for f in found.factoids] == [FAITHFUL, WRONG]
    assert found.unchecked_from == answer.index("Aspirin") and found.settings["calls"] == 2
    ran.clear()
    nothing = asyncio.run(capped(0))
    assert ran == [] and nothing.factoids == [] and nothing.unchecked_from == 0
    with pytest.raises(JudgeCallCapError):  # the model itself never runs past the cap
        asyncio.run(_capped(detector.model.supported, [(PASSAGE, WRONG)] * 2, 1))
    assert ran == []


async def _capped(call, texts, cap: int):
    with call_budget(cap):
        return await call(texts)


def test_a_token_classifier_past_its_cap_labels_the_answers_first_parts(tokens_folder):
    # a window of 24 tokens: the context alone before the answer, which goes in parts of one sentence
    detector = check(tokens_folder, shape="tokens", max_tokens=24, template="{context}", batch=1)
    answer = f"{FAITHFUL} {WRONG}"

    async def capped():
        with call_budget(1):
            return await detector.detect(RagInput(question=QUESTION, passages=[PASSAGE]), answer)

    found = asyncio.run(capped())
    assert [(f.text, f.label) for f in found.factoids] == [(FAITHFUL, "supported")]
    assert found.unchecked_from == len(FAITHFUL) + 1 and found.settings["sequences"] == 1


def test_a_token_budget_for_the_context_keeps_the_sentences_the_answer_rests_on(tokens_folder):
    passages = [" ".join([*FILLER, PASSAGE])]

    def prompt_of(detector: VerifierCheck) -> str:
        prompts = []
        real = detector.model.hallucinated

        async def seen(texts):
            prompts.extend(prompt for prompt, _ in texts)
            return await real(texts)

        detector.model.hallucinated = seen  # type: ignore[method-assign]
        assert not run(detector, FAITHFUL, passages).flagged  # the sentence it rests on is read
        return prompts[0]

    focused = prompt_of(check(tokens_folder, shape="tokens", context_tokens=24))
    assert PASSAGE in focused and not any(filler in focused for filler in FILLER)
    whole = prompt_of(check(tokens_folder, shape="tokens"))
    assert PASSAGE in whole and all(filler in whole for filler in FILLER)


def test_the_label_is_read_by_name_or_index(claims_folder):
    by_name = run(check(claims_folder, label="SUPPORTED"), WRONG, [PASSAGE])
    by_index = run(check(claims_folder, label="1"), WRONG, [PASSAGE])
    inverted = run(check(claims_folder, label="unsupported"), WRONG, [PASSAGE])
    assert by_name.score == by_index.score == pytest.approx(0.9975, abs=1e-3)
    assert inverted.score == pytest.approx(0.0025, abs=1e-3)
    with pytest.raises(MorphguardError, match="not a label of the model"):
        check(claims_folder, label="entailment")


def test_a_missing_or_broken_model_is_a_clear_error(tmp_path, claims_folder):
    with pytest.raises(MorphguardError, match="no such folder"):
        check(tmp_path / "nowhere")
    (tmp_path / "tokenizer.json").write_text((claims_folder / "tokenizer.json").read_text())
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(MorphguardError, match="not a model ONNX Runtime can load"):
        check(tmp_path)


def test_a_token_classifier_flags_the_tokens_the_context_does_not_hold(tokens_folder):
    detector = check(tokens_folder, shape="tokens")
    found = run(detector, f"{FAITHFUL} {WRONG}", [PASSAGE])
    assert found.flagged and found.score == pytest.approx(0.982, abs=1e-3)
    flagged = [f for f in found.factoids if f.label == "unsupported"]
    assert [f.text for f in flagged] == ["safe throughout"]
    start = len(FAITHFUL) + 1 + WRONG.index("safe")
    assert (flagged[0].start, flagged[0].end) == (start, start + len("safe throughout"))
    assert "1 span(s)" in flagged[0].reason and str(tokens_folder) in flagged[0].reason
    supported = [f for f in found.factoids if f.label == "supported"]
    assert [f.text for f in supported] == [FAITHFUL]

    assert not run(detector, FAITHFUL, [PASSAGE]).flagged


def test_a_long_answer_goes_in_parts_whose_offsets_are_the_answers(tokens_folder):
    # 200 tokens a window: about 80 of prompt, and parts of at most 100 tokens of an answer of 142
    answer = " ".join([FAITHFUL] * 15 + [WRONG])
    found = run(check(tokens_folder, shape="tokens", max_tokens=200), answer, [PASSAGE])
    assert found.settings["sequences"] > 1
    (flagged,) = [f for f in found.factoids if f.label == "unsupported"]
    assert answer[flagged.start:flagged.end] == "safe throughout"


def test_a_calibration_file_turns_scores_into_its_probabilities(tmp_path, claims_folder):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"detector": "verifier", "calibration": [1.0, -3.0]}))
    raw = run(check(claims_folder), WRONG, [PASSAGE])
    calibrated = run(check(claims_folder, calibration=str(path)), WRONG, [PASSAGE])
    assert calibrated.score < raw.score
    assert calibrated.features["worst"] == raw.features["worst"]
    assert calibrated.factoids[0].score == calibrated.score
    steps = calibrated.settings["explanation"]
    assert [s["step"] for s in steps] == ["verifier", "calibration"] and str(path) in steps[1]["text"]
    assert steps[1]["after"] == round(calibrated.score, 4)


def test_auto_runs_the_verifier_where_the_judge_is_one(claims_folder):
    assert resolve_auto(Config())[0] != "verifier"
    config = judged(claims_folder)
    name, why = resolve_auto(config)
    assert name == "verifier" and str(claims_folder) in why
    assert isinstance(build_detector(config), VerifierCheck)
    with pytest.raises(MorphguardError, match="judge is a trained verifier"):  # a check that asks a chat model
        build_detector(config, name="sentences")
    with pytest.raises(MorphguardError, match="needs a trained verifier as the judge"):
        build_detector(Config(), name="verifier")


def test_the_settings_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="set judge.model to the verifier's folder"):
        Config.model_validate({"judge": {"runtime": "onnx"}})
    with pytest.raises(ValueError, match="needs judge.api_base"):
        Config.model_validate({"judge": {"runtime": "tei", "model": "m"}})
    served = {"runtime": "tei", "model": "m", "api_base": "http://x"}
    with pytest.raises(ValueError, match="runs in process only"):
        Config.model_validate({"judge": served, "verifier": {"shape": "tokens"}})
    with pytest.raises(ValueError, match="set verifier.template"):
        Config.model_validate({"judge": {**served, "runtime": "vllm-classify"}})
    with pytest.raises(ValueError, match="Extra inputs"):  # the model is the judge's, not the section's
        Config.model_validate({"verifier": {"model": "m"}})


def test_a_sentence_longer_than_a_window_is_cut_not_an_error(tokens_folder, claims_folder):
    sentence = "Ibuprofen is safe throughout pregnancy " + "and the third trimester " * 40 + "."
    found = run(check(tokens_folder, shape="tokens", max_tokens=64), sentence, [PASSAGE])
    assert found.flagged and "safe throughout" in found.factoids[0].text  # the context cut too: more is flagged
    assert run(check(claims_folder, max_tokens=64), sentence, [PASSAGE]).flagged


def test_a_model_that_fails_to_run_is_the_checks_error_not_a_crash(claims_folder, monkeypatch):
    detector = check(claims_folder)

    def broken(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT")

    monkeypatch.setattr(detector.model.session, "run", broken)  # type: ignore[attr-defined]
    with pytest.raises(LLMError, match="could not run"):
        run(detector, WRONG, [PASSAGE])


def test_doctor_loads_the_verifier_in_its_folder_and_asks_it_once(claims_folder, tmp_path):
    import yaml

    from tests.commands import morphguard

    def doctor(folder: Path):
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"judge": {"runtime": "onnx", "model": str(folder)}}))
        return morphguard("doctor", "--config", "config.yaml", cwd=tmp_path)

    done = doctor(claims_folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok   verifier {claims_folder} (runtime onnx; shape claims; loaded and probe ")
    missing = doctor(tmp_path / "nowhere")
    assert missing.returncode == 2 and "FAIL verifier" in missing.stdout and "no such folder" in missing.stdout
