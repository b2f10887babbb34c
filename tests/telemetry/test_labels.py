"""Metric labels come from configured values only: whatever a client or a provider writes maps to a bounded set."""

from __future__ import annotations

import inspect

import pytest

from morphguard.config import Config
from morphguard.proxy import errors
from morphguard.telemetry import labels


@pytest.fixture
def configured():
    config = Config.model_validate({
        "telemetry": {"metric_models": ["gpt-4o-mini", "gpt-4o*", "claude-*"]},
        "proxy": {"litellm_routes": [{"prefix": "bedrock/"}]},
        "policy": {"profiles": {"general": {}, "clinic": {}}, "routes": [{"profile": "clinic", "models": ["med-*"]}]},
    })
    labels.configure(config)
    yield
    labels.configure(Config())


@pytest.mark.usefixtures("configured")
def test_a_model_is_labelled_by_the_first_configured_pattern_it_matches():
    assert labels.model("gpt-4o-mini") == "gpt-4o-mini"  # an exact name first: a label of its own
    assert labels.model("GPT-4o-2024-08-06") == "gpt-4o*"
    assert labels.model("openai/gpt-4o") == "gpt-4o*"  # with or without a provider prefix
    assert labels.model("med-large") == "med-*"  # a route's pattern
    assert labels.model("bedrock/anything") == "bedrock/*"  # a litellm route's prefix
    assert labels.model("attacker-model-00001") == labels.OTHER
    assert labels.model("gpt-4") == labels.OTHER  # not configured here
    assert labels.model(None) is None


@pytest.mark.usefixtures("configured")
def test_any_number_of_client_strings_gives_a_bounded_set_of_labels():
    names = [f"m-{i}" for i in range(10_000)] + [f"gpt-4o-{i}" for i in range(10_000)] + ["x" * 10_000]
    assert {labels.model(n) for n in names} == {labels.OTHER, "gpt-4o*"}
    assert {labels.topic(t) for t in ("pregnancy", "general", "made-up", "Pregnancy")} == {
        "pregnancy", "general", labels.OTHER}
    assert {labels.profile(p) for p in ("clinic", "general", "made-up")} == {"clinic", "general", labels.OTHER}
    assert labels.action("block") == "block" and labels.action("explode") == labels.OTHER
    assert labels.detector("grounding") == "grounding" and labels.detector("../../etc") == labels.OTHER


def test_reasons_are_the_known_codes_or_other():
    assert labels.reason("upstream_timeout") == "upstream_timeout"
    assert labels.reason("upstream_http_429") == "upstream_http_429"
    assert labels.reason("upstream_http_799") == "upstream_http_other"  # a provider's made-up status
    assert labels.reason("upstream_http_x" * 100) == "upstream_http_other"
    assert labels.reason("whatever a stack trace said") == labels.OTHER


def test_every_error_code_the_proxy_answers_with_is_a_known_reason():
    for name, constructor in inspect.getmembers(errors, inspect.isfunction):
        if inspect.signature(constructor).return_annotation in ("ProxyError", errors.ProxyError):
            args = [1 if p.annotation in ("int", "float") else "x"
                    for p in inspect.signature(constructor).parameters.values() if p.default is inspect.Parameter.empty]
            error = constructor(*args)
            assert labels.reason(error.code) == error.code, name


def test_the_defaults_before_any_configuration_are_bounded_too():
    labels.configure(Config())
    assert labels.model("gpt-4o-2024-08-06") == "gpt-4o*"
    assert labels.model("claude-sonnet-4") == "claude-*"
    assert labels.model("made-up") == labels.OTHER
    assert labels.topic("pregnancy") == "pregnancy" and labels.profile("clinic") == labels.OTHER
