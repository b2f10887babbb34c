"""Every wait on the provider is bounded: a response that never ends is cut at `upstream.response_s`, one that never
begins at `upstream.first_byte_s`; a request finding every connection held gets a clear 503 after
`upstream.pool_wait_s` instead of queueing behind them, and is served again once they are cut; a client that leaves
a plain request closes the provider's request too. Each through the real proxy against the scripted provider."""

from __future__ import annotations

import sqlite3
import threading
import time

import httpx
import pytest

from tests.e2e.test_proxy import PASSAGE, QUESTION

pytestmark = pytest.mark.slow  # seconds of stuck responses each


def body(model: str, stream: bool = False) -> dict:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": PASSAGE}}


def inflight(provider: str) -> dict[str, int]:
    return httpx.get(provider.removesuffix("/v1") + "/_inflight", timeout=5).json()


def wait_until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def reasons(folder) -> list[str | None]:
    with sqlite3.connect(folder / "audit.db") as db:
        return [r for (r,) in db.execute("SELECT reason FROM decisions")]


def test_responses_that_never_end_are_cut_and_never_starve_healthy_requests(proxy_factory, provider):
    base = proxy_factory(upstream={"response_s": 3, "timeout_s": 30, "max_connections": 3, "pool_wait_s": 0.5})
    endings: list[str] = []

    def endless() -> None:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body("endless-stream", stream=True),
                          timeout=60) as response:
            endings.append(response.status_code == 200 and [line for line in response.iter_lines() if line][-1])

    streams = [threading.Thread(target=endless) for _ in range(3)]
    for thread in streams:
        thread.start()
    assert wait_until(lambda: inflight(provider)["endless-stream"] == 3, 5)
    busy = httpx.post(base + "/v1/chat/completions", json=body("faithful"), timeout=30)  # every connection is held
    assert busy.status_code == 503 and busy.headers["retry-after"]
    assert busy.json()["error"]["code"] == "upstream_busy" and busy.json()["error"]["type"] == "server_error"
    for thread in streams:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in streams)  # each cut by the proxy, not left to run forever
    assert len(endings) == 3 and all("upstream_timeout" in ending for ending in endings)  # said in the stream
    assert wait_until(lambda: inflight(provider)["endless-stream"] == 0, 5)  # the provider's side closed too
    healthy = httpx.post(base + "/v1/chat/completions", json=body("faithful"), timeout=30)
    assert healthy.status_code == 200 and healthy.json()["morphguard"]["checked"]
    plain = httpx.post(base + "/v1/chat/completions", json=body("endless-stream"), timeout=60)  # a body never ending
    assert plain.status_code == 504 and plain.json()["error"]["code"] == "upstream_timeout"
    assert reasons(proxy_factory.folders[base]).count("upstream_busy") == 1  # each accounted for


def test_a_response_that_never_begins_is_cut_at_the_first_byte_bound(proxy_factory, provider):
    base = proxy_factory(upstream={"first_byte_s": 1, "timeout_s": 60})
    response = httpx.post(base + "/v1/chat/completions", json=body("never-answers"), timeout=30)
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"
    assert wait_until(lambda: inflight(provider)["never-answers"] == 0, 5)


def test_a_client_that_leaves_a_plain_request_ends_the_providers_request(proxy_factory, provider):
    base = proxy_factory(upstream={"timeout_s": 60})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/chat/completions", json=body("never-answers"), timeout=1)
    assert wait_until(lambda: inflight(provider)["never-answers"] == 0, 5)  # not held for the 60 s bound
    folder = proxy_factory.folders[base]
    assert wait_until(lambda: "client_disconnected" in reasons(folder), 5)  # and its row says the client left
