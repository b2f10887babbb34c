"""The fault matrix: every upstream fault × check mode (inline/async) × stream mode (buffer/passthrough).

For each: what the official client sees (an error it raises, never a silent 200), how often the
provider was asked (nothing it may have processed is sent twice), and the audit row with the reason.
"""

from __future__ import annotations

import sqlite3
import time

import httpx
import openai
import pytest

# every upstream fault in every mode, each through a real proxy
pytestmark = pytest.mark.slow

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
MODES = [("inline", "buffer"), ("inline", "passthrough"), ("async", "buffer"), ("async", "passthrough")]

# fault model → (status the client sees, error code, upstream attempts) for a plain (non-streamed) request
PLAIN = {
    "slow": (504, "upstream_timeout", 1),  # no headers in time: not resent (it may have been processed)
    "stall-body": (504, "upstream_timeout", 1),
    "reset": (502, "upstream_unavailable", 1),
    "fail-500": (502, "upstream_unavailable", 1),
    "unavailable": (502, "upstream_unavailable", 3),  # 503 says "not processed": retried
    "rate-limited": (429, "rate_limit", 3),  # the provider's 429 after the retries, its headers kept
    "nan": (502, "upstream_malformed", 1),
    "content-int": (502, "upstream_malformed", 1),
}
# streamed fault → (status when the stream is buffered, error code)
STREAMED = {
    "slow": (504, "upstream_timeout"),
    "truncated": (502, "upstream_stream_broken"),
    "malformed-chunk": (502, "upstream_malformed"),
    "stall-stream": (504, "upstream_timeout"),
    "reset-stream": (502, "upstream_stream_broken"),
    "fail-500": (502, "upstream_unavailable"),
    "rate-limited": (429, "rate_limit"),
}


@pytest.fixture(scope="module")
def proxies(proxy_factory) -> dict[tuple[str, str], str]:
    return {(mode, stream): proxy_factory(mode=mode, stream_mode=stream, upstream={"timeout_s": 1.5})
            for mode, stream in MODES}


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=30)


def attempts(provider: str, model: str) -> int:
    return sum(r["body"].get("model") == model for r in httpx.get(provider.removesuffix("/v1") + "/_requests").json())


def last_row(proxy_factory, base: str, model: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM decisions WHERE model = ? ORDER BY id DESC LIMIT 1", (model,)).fetchone()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no audit row for {model}"
            return dict(row)
        time.sleep(0.1)


def create(base: str, model: str, **extra):
    return client(base).chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                extra_body={"morphguard": {"context": PASSAGE}}, **extra)


@pytest.mark.parametrize("mode", MODES, ids="-".join)
@pytest.mark.parametrize("fault", list(PLAIN))
def test_plain_request_faults(proxies, proxy_factory, provider, mode, fault):
    base = proxies[mode]
    status, code, sent = PLAIN[fault]
    before = attempts(provider, fault)
    with pytest.raises(openai.APIStatusError) as err:
        create(base, fault)
    assert err.value.status_code == status
    assert err.value.code == code
    assert attempts(provider, fault) - before == sent
    if fault == "rate-limited":
        assert err.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert "retry-after" in err.value.response.headers
    row = last_row(proxy_factory, base, fault)
    assert row["checked"] == 0 and row["reason"] == (f"upstream_http_{status}" if status < 500 else code)


@pytest.mark.parametrize("mode", MODES, ids="-".join)
@pytest.mark.parametrize("fault", list(STREAMED))
def test_streamed_request_faults(proxies, proxy_factory, mode, fault):
    base = proxies[mode]
    status, code = STREAMED[fault]
    headers_first = fault in ("truncated", "malformed-chunk", "stall-stream", "reset-stream")
    with pytest.raises(openai.APIError) as err:
        list(create(base, fault, stream=True))
    if headers_first and mode[1] == "passthrough":
        # the 200 is already sent: the error arrives as the stream's last event, and the SDK raises it
        assert not isinstance(err.value, openai.APIStatusError)
        assert err.value.body["code"] == code
    else:
        assert isinstance(err.value, openai.APIStatusError) and err.value.status_code == status
    row = last_row(proxy_factory, base, fault)
    assert row["checked"] == 0 and row["reason"] == (f"upstream_http_{status}" if status < 500 else code)


@pytest.mark.parametrize("mode", [m for m in MODES if m[1] == "passthrough"], ids="-".join)
def test_a_client_that_leaves_mid_stream_is_still_audited(proxies, proxy_factory, mode):
    base = proxies[mode]
    body = {"model": "slow-stream", "stream": True, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": PASSAGE}}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # one chunk, then the client hangs up
    row = last_row(proxy_factory, base, "slow-stream")
    assert row["checked"] == 0 and row["reason"] == "client_disconnected"
