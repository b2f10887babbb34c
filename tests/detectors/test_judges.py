"""Which check `detector.name: auto` runs for the configured judge, and how it says so."""

import logging

from morphguard.config import parse_config
from morphguard.detectors.judges import chosen_detector


def test_auto_runs_combined_with_the_judge_its_weights_were_fitted_with():
    assert chosen_detector(parse_config("")) == "combined"


def test_auto_runs_sentences_with_an_api_judge_and_says_why_at_info_not_as_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="morphguard.detectors.judges")
    assert chosen_detector(parse_config("judge: {model: openai/gpt-4.1-mini-auto-test}")) == "sentences"
    said = [r for r in caplog.records if "detector auto" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert "fitted with the judge" in said[0].getMessage() and "gpt-4.1-mini-auto-test" in said[0].getMessage()
