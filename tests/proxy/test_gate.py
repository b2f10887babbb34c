"""Canonical paths and the upstream URL: no client path leaves the configured base."""

from __future__ import annotations

import pytest

from morphguard.config import ProxySettings, UpstreamSettings
from morphguard.proxy.errors import ProxyError
from morphguard.proxy.gate import canonical_path
from morphguard.proxy.upstream import Upstream


@pytest.mark.parametrize("raw, canonical", [
    ("/v1//chat/completions", "/v1/chat/completions"), ("/v1/chat/completions/", "/v1/chat/completions"),
    ("/v1/./chat/./completions", "/v1/chat/completions"), ("//v1///chat//completions//", "/v1/chat/completions"),
    ("/", "/"), ("", "/")])
def test_paths_are_made_canonical(raw, canonical):
    assert canonical_path(raw) == canonical


@pytest.mark.parametrize("raw", ["/v1/../admin", "/v1/models/..", "/v1/\x00", "/v1/a\\b", "/v1/\x7f", "/v1/a\nb"])
def test_paths_without_a_safe_canonical_form_are_refused(raw):
    with pytest.raises(ProxyError) as err:
        canonical_path(raw)
    assert err.value.status == 400


@pytest.mark.parametrize("base", ["https://api.example.com/v1", "http://127.0.0.1:9000/openai/v1/"])
@pytest.mark.parametrize("path", ["http://evil.example/x", "http:/evil.example/x", "//evil.example/x",
                                  "models/a%2F..%2Fb", "@evil.example", "models?x=1#frag", "models/é"])
def test_the_upstream_url_always_stays_under_the_base(base, path):
    upstream = Upstream(ProxySettings(upstream=UpstreamSettings(base_url=base)))
    url = upstream.url_for(path)
    expected = upstream.base
    assert (url.scheme, url.host, url.port) == (expected.scheme, expected.host, expected.port)
    assert url.raw_path.startswith(expected.raw_path) and url.raw_query_string == "" and url.raw_fragment == ""


def test_dot_segments_never_reach_the_url_builder():
    upstream = Upstream(ProxySettings())
    with pytest.raises(ValueError):
        upstream.url_for("models/../../admin")
