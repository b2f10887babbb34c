"""The request path's intake (`flow.accept`): who a check is on behalf of, for fair turns at the judge."""

from __future__ import annotations

from morphguard.config import Config
from morphguard.policy.engine import PolicyEngine, RequestFacts
from morphguard.proxy.context import Extraction
from morphguard.proxy.flow import accept

PROXY_KEY = "sk-proxy-key-0001"


def who(key: str | None, address: str | None = "10.0.0.1", prefix: str = "") -> str:
    config = Config.model_validate({"proxy": {"keys": [PROXY_KEY]}})
    facts = RequestFacts(api_key=key, address=address, path_prefix=prefix)
    return accept(PolicyEngine(config.policy), config, Extraction({}, None), facts).client


def test_a_key_the_proxy_does_not_know_names_no_one_turns_go_by_address_and_route():
    # rotating keys, a shared placeholder and none at all are one client from one address on one route
    assert who("sk-rotating-1") == who("sk-rotating-2") == who("EMPTY") == who(None) != ""
    assert who("EMPTY", "10.0.0.2") != who("EMPTY")  # another address, another client
    assert who("EMPTY", prefix="/clinic") != who("EMPTY")  # another route, another client


def test_a_proxy_key_names_its_holder_wherever_it_comes_from():
    assert who(PROXY_KEY, "10.0.0.1") == who(PROXY_KEY, "10.0.0.2") != who("sk-other", "10.0.0.1")
    assert PROXY_KEY not in who(PROXY_KEY)  # a digest, never the key


def test_a_request_handed_over_in_process_is_named_by_the_key_its_host_authenticated():
    assert who("sk-litellm-a", None) != who("sk-litellm-b", None)
