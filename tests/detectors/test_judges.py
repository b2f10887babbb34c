"""Which check `detector.name: auto` runs for the configured judge, and how it says so."""

import logging

import pytest

from morphguard.config import parse_config
from morphguard.detectors import build_detector, registry, resolve, stage_models


def test_auto_runs_combined_with_the_judge_its_weights_were_fitted_with():
    name, why = registry.resolve_auto(parse_config(""))
    assert name == "combined" and "fitted with this judge (local)" in why


def test_auto_runs_sentences_with_an_api_judge_and_says_why():
    config = parse_config("judge: {model: openai/gpt-4.1-mini-auto-test}")
    name, why = registry.resolve_auto(config)
    assert name == "sentences"
    assert "fitted with the judge" in why and "gpt-4.1-mini-auto-test" in why
    # every reading of the configured detector comes to the same choice
    assert registry.configured(config) == "sentences" and resolve(config)[0].name == "sentences"
    assert stage_models(config) == [None]


def test_combined_weights_fitted_with_another_judge_send_auto_to_sentences(tmp_path):
    from morphguard.detectors.combined import load_weights

    weights = load_weights(None)
    fitted = weights.model_copy(update={"fitted_on": {**weights.fitted_on, "judge": {"model": "elsewhere"}}})
    path = tmp_path / "weights.json"
    path.write_text(fitted.model_dump_json())
    name, why = registry.resolve_auto(parse_config(f"combined: {{weights: '{path}'}}"))
    assert name == "sentences" and "'elsewhere'" in why


def test_building_the_auto_detector_logs_the_choice_and_its_reason_at_info(caplog):
    caplog.set_level(logging.INFO, logger="morphguard.detectors.registry")
    detector = build_detector(parse_config("judge: {model: openai/gpt-4.1-mini-auto-test}"))
    assert detector.name == "sentences"
    said = [r for r in caplog.records if "detector auto" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "sentences, because" in said[0].getMessage() and "gpt-4.1-mini-auto-test" in said[0].getMessage()


def test_a_named_detector_is_built_without_the_auto_rule(caplog):
    caplog.set_level(logging.INFO, logger="morphguard.detectors.registry")
    assert build_detector(parse_config("detector: {name: grounding}")).name == "grounding"
    assert not [r for r in caplog.records if "detector auto" in r.getMessage()]


def test_a_detector_whose_settings_are_not_the_configs_section_is_refused():
    from pydantic import BaseModel

    class Elsewhere(BaseModel):
        pass

    spec = registry.DetectorSpec(name="grounding-copy", settings=Elsewhere, build=lambda *a: None)  # type: ignore
    with pytest.raises(ValueError, match="DETECTOR_SECTIONS"):
        registry.register(spec)
    assert "grounding-copy" not in registry.SPECS
