"""A request cannot leave its route by how it spells the model or the Authorization scheme."""

from __future__ import annotations

import pytest

from morphguard.config import PolicySettings
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.proxy.credentials import bearer_token, two_keys
from morphguard.proxy.credentials import presented_key as _presented_key


def engine(**policy) -> PolicyEngine:
    return PolicyEngine(PolicySettings.model_validate(policy))


@pytest.mark.parametrize("model", ["GPT-4o", "openai/gpt-4o", "OpenAI/GPT-4o-mini", " gpt-4o ",
                                   "ｇｐｔ-４ｏ", "gpt-\u200b4o", "openrouter/openai/gpt-4-turbo"])
def test_model_patterns_match_the_normalised_name(model):
    e = engine(profiles={"general": {}, "strict": {}}, routes=[{"profile": "strict", "models": ["gpt-4*"]}])
    assert e.profile_for(RequestFacts(model=model)) == "strict"


def test_model_patterns_still_tell_models_apart():
    e = engine(profiles={"general": {}, "strict": {}, "claude": {}},
               routes=[{"profile": "strict", "models": ["GPT-4*"]},
                       {"profile": "claude", "models": ["anthropic/*"]}])
    assert e.profile_for(RequestFacts(model="gpt-3.5-turbo")) == "general"
    assert e.profile_for(RequestFacts(model="gpt4")) == "general"
    assert e.profile_for(RequestFacts(model="anthropic/claude-sonnet-4")) == "claude"  # a provider pattern
    assert e.profile_for(RequestFacts(model="claude-sonnet-4")) == "general"


@pytest.mark.parametrize("authorization", ["bearer KB", "BEARER KB", "Bearer\tKB", "Bearer   KB ",
                                           " bEaReR \t KB"])
def test_the_key_is_read_with_the_scheme_in_any_case(authorization):
    assert _presented_key({"authorization": authorization}) == "KB"
    e = engine(profiles={"general": {}, "keyed": {}}, routes=[{"profile": "keyed", "api_keys": ["KB"]}])
    assert e.profile_for(RequestFacts(api_key=_presented_key({"authorization": authorization}))) == "keyed"


def test_other_credentials_are_read_as_before():
    assert _presented_key({"x-api-key": "KA"}) == "KA"
    assert _presented_key({"authorization": "KB"}) == "KB"  # a bare key, as some clients send it
    assert _presented_key({"authorization": "Basic dXNlcg=="}) == "Basic dXNlcg=="  # never equal to a key
    assert _presented_key({"api-key": "KC"}) == "KC"  # Azure's header
    assert _presented_key({}) is None
    assert bearer_token("Bearer") is None and bearer_token("Bearerx KB") is None and bearer_token("") is None


@pytest.mark.parametrize("headers, two", [
    ({"authorization": "Bearer KB", "x-api-key": "KB"}, False),  # the same key twice is one key
    ({"authorization": "bearer  KB", "api-key": "KB", "x-api-key": "KB"}, False),
    ({"authorization": "Bearer KB", "x-api-key": "KA"}, True),
    ({"x-api-key": "KB", "api-key": "KA"}, True),
    ({"authorization": "Basic dXNlcg==", "x-api-key": "KB"}, True),
    ({"authorization": "Bearer KB", "x-api-key": " "}, False),  # an empty header names no key
])
def test_two_different_keys_are_told_from_one_key_in_two_headers(headers, two):
    assert two_keys(headers) is two


def test_a_model_the_caller_only_names_matches_no_model_route():
    e = engine(profiles={"general": {}, "open": {}, "keyed": {}},
               routes=[{"profile": "open", "models": ["internal-*"]}, {"profile": "keyed", "api_keys": ["KB"]}])
    assert e.profile_for(RequestFacts(model="internal-x")) == "open"  # the model the provider is asked for
    assert e.profile_for(RequestFacts(model="internal-x", model_named=True)) == "general"
    assert e.profile_for(RequestFacts(api_key="KB", model="internal-x", model_named=True)) == "keyed"
