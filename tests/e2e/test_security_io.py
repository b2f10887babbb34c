"""What the proxy reads and writes cannot be turned against it: over-long stream lines, bodies that are cheap to send
and dear to parse, request heads that never end, clients that leave mid-upload, and provider errors that echo a key.
Real processes over real sockets, as in test_security.py."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.otlp_receiver import OtlpReceiver

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
KEY = "mg-proxy-key-0001"
UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ROUTE_KEY = "sk-route-secret-9876543210"
CLIENT_KEY = "sk-client-own-key-5555"


def chat(model: str, **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "morphguard": {"context": PASSAGE}, **extra}


def audit_rows(proxy_factory, base: str) -> list[dict]:
    with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM decisions ORDER BY id")]


def log_of(proxy_factory, base: str) -> str:
    return (proxy_factory.folders[base] / "proxy.log").read_text(errors="replace")


def address(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


@pytest.fixture(scope="module")
def buffered(proxy_factory) -> str:
    return proxy_factory(stream_mode="buffer")


# --- stream lines ------------------------------------------------------------------------------------------------

def test_an_over_long_stream_line_is_a_502_and_audited(buffered, proxy_factory):
    """32 MiB in one SSE line: refused once 1 MiB of it has arrived, never held whole."""
    response = httpx.post(buffered + "/v1/chat/completions", json=chat("giant-line-32768", stream=True), timeout=60)
    error = response.json()["error"]
    assert response.status_code == 502 and error["code"] == "upstream_malformed"
    assert "longer than 1048576 bytes" in error["message"]
    row = audit_rows(proxy_factory, buffered)[-1]
    assert (row["model"], row["reason"], row["checked"]) == ("giant-line-32768", "upstream_malformed", 0)
    # A long line within the limit is a line like any other.
    response = httpx.post(buffered + "/v1/chat/completions", json=chat("giant-line-512", stream=True), timeout=60)
    assert response.status_code == 200 and '"checked":true' in response.text


def test_an_over_long_line_mid_stream_ends_the_stream_with_an_error(proxy_factory):
    base = proxy_factory(stream_mode="passthrough")
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model="giant-line-32768", messages=[{"role": "user", "content": QUESTION}],
                                            stream=True, extra_body={"morphguard": {"context": PASSAGE}})
    with pytest.raises(openai.APIError, match="longer than 1048576 bytes"):
        list(stream)
    deadline = time.monotonic() + 10
    while audit_rows(proxy_factory, base)[-1:] == [] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert audit_rows(proxy_factory, base)[-1]["reason"] == "upstream_malformed"


def test_an_over_long_line_of_a_responses_stream_is_a_502(buffered, proxy_factory):
    body = {"model": "giant-line-32768", "input": QUESTION, "stream": True, "morphguard": {"context": PASSAGE}}
    response = httpx.post(buffered + "/v1/responses", json=body, timeout=60)
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_malformed"
    assert audit_rows(proxy_factory, buffered)[-1]["reason"] == "upstream_malformed"


# --- bodies dear to parse ----------------------------------------------------------------------------------------

def nested_lists_body(megabytes: float = 3.1, depth: int = 60) -> bytes:
    """A chat body carrying ~1.5 million lists, none deeper than the 64-level limit."""
    one = "[" * depth + "]" * depth
    count = int(megabytes * 1_000_000) // (len(one) + 1)
    return ('{"model":"faithful","messages":[{"role":"user","content":"hi"}],"x":['
            + ",".join([one] * count) + "]}").encode()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_a_body_of_a_million_lists_is_refused_and_other_clients_are_answered_meanwhile(buffered, proxy_factory,
                                                                                        route):
    attack = nested_lists_body()
    if route == "/v1/responses":
        attack = attack.replace(b'"messages":[{"role":"user","content":"hi"}]', b'"input":"hi"')
    before = len(audit_rows(proxy_factory, buffered))
    results: list[httpx.Response] = []

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(3):
                results.append(client.post(buffered + route, content=attack,
                                           headers={"content-type": "application/json"}))

    sender = threading.Thread(target=send)
    latencies: list[float] = []
    with httpx.Client(timeout=30) as health:
        sender.start()
        while sender.is_alive():
            started = time.perf_counter()
            assert health.get(buffered + "/healthz").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)
    sender.join()
    assert [r.status_code for r in results] == [400, 400, 400]
    assert all("too many JSON values" in r.json()["error"]["message"] for r in results)
    assert len(audit_rows(proxy_factory, buffered)) == before  # refused before it was accepted
    print(f"\n{route}: worst /healthz {max(latencies) * 1000:.0f} ms over {len(latencies)} probes")


def test_a_deep_but_small_body_is_still_accepted(buffered):
    body = chat("faithful", tools=[{"type": "function", "function": {
        "name": "f", "parameters": json.loads('{"type": "object", "x": ' + "[" * 58 + "]" * 58 + "}")}}])
    response = httpx.post(buffered + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.json()["morphguard"]["checked"]


# --- request heads that never end --------------------------------------------------------------------------------

# two processes: uvicorn starts each from a fresh interpreter (spawn), seconds of imports apiece
@pytest.fixture(scope="module", params=[1, pytest.param(2, marks=pytest.mark.slow)],
                ids=["one-process", "two-processes"])
def impatient(proxy_factory, request) -> str:
    return proxy_factory(header_timeout_s=1, processes=request.param)


def until_closed(conn: socket.socket, timeout: float = 15) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took; fails after `timeout`."""
    conn.settimeout(timeout)
    started, received = time.monotonic(), b""
    try:
        while chunk := conn.recv(4096):
            received += chunk
    except TimeoutError:
        pytest.fail(f"still open after {timeout} s")
    except ConnectionResetError:
        pass
    return received, time.monotonic() - started


def test_a_request_head_that_never_ends_loses_its_connection(impatient):
    with socket.create_connection(address(impatient)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):  # a header line now and then, as slowloris sends them
            time.sleep(0.3)
            conn.sendall(b"X-Slow: 1\r\n")
        received, took = until_closed(conn)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "request_timeout"
    print(f"\nan unfinished head kept its connection {took + 0.9:.1f} s")


def test_a_silent_connection_is_closed(impatient):
    with socket.create_connection(address(impatient)) as conn:
        received, _ = until_closed(conn)
    assert received == b""


def test_a_slow_head_within_the_deadline_and_the_next_request_on_its_connection(impatient):
    with socket.create_connection(address(impatient)) as conn:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for i in range(0, len(request), 8):  # dripped, complete in ~0.5 s
            conn.sendall(request[i:i + 8])
            time.sleep(0.1)
        conn.settimeout(5)
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request on the kept-alive connection stalls
        received, _ = until_closed(conn)
    assert received.startswith(b"HTTP/1.1 408")


# --- a client that leaves mid-upload -----------------------------------------------------------------------------

def test_a_client_that_leaves_mid_upload_ends_quietly(proxy_factory):
    base = proxy_factory()
    before = len(audit_rows(proxy_factory, base))
    with socket.create_connection(address(base)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 200000\r\n\r\n" + b'{"model": "faithful", "messages": [' + b" " * 5_000)
        time.sleep(0.5)
    deadline = time.monotonic() + 10
    while "the client left" not in log_of(proxy_factory, base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    log = log_of(proxy_factory, base)
    left = [line for line in log.splitlines() if "the client left" in line]
    assert len(left) == 1 and " WARNING " in f" {left[0]}" and "/v1/chat/completions" in left[0]
    assert "Traceback" not in log and "ERROR" not in log
    assert len(audit_rows(proxy_factory, base)) == before


# --- provider errors that echo a key -----------------------------------------------------------------------------

def partial(key: str) -> str:
    return f"{key[:7]}*****{key[-4:]}"


def leaks(text: str, *keys: str) -> list[str]:
    """The keys, whole or as a provider echoes them partly, found in `text`. A key's last four characters count
    only standing alone ("...6789"), not inside a longer token such as a port number or a timestamp."""
    found = [k for key in keys for k in (key, partial(key)) if k in text]
    return found + [key[-4:] for key in keys
                    if re.search(rf"(?<![0-9A-Za-z]){re.escape(key[-4:])}(?![0-9A-Za-z])", text)]


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def injecting(proxy_factory, provider, receiver) -> str:
    """Injects its own upstream key; a litellm route with its own key; spans to an OTLP receiver."""
    return proxy_factory(upstream={"api_key": UPSTREAM_KEY}, keys=[KEY],
                         litellm_routes=[{"prefix": "openai/", "api_base": provider, "api_key": ROUTE_KEY}],
                         telemetry={"exporter": "otlp-http", "endpoint": receiver.endpoint, "metrics": False})


@pytest.mark.parametrize("model", ["leak-key", "leak-key-full"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_error_echoing_the_upstream_key_reaches_the_client_masked(injecting, model, stream):
    response = httpx.post(injecting + "/v1/chat/completions", json=chat(model, stream=stream),
                          headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert response.status_code == 401
    message = response.json()["error"]["message"]
    assert message.startswith("Incorrect API key provided: [masked]. You can find your API key")
    assert leaks(response.text, UPSTREAM_KEY, KEY) == []


@pytest.mark.parametrize("path, body, headers", [
    ("/v1/responses", {"model": "leak-key", "input": QUESTION}, {"authorization": f"Bearer {KEY}"}),
    ("/v1/messages", {"model": "leak-key-full", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
     {"x-api-key": KEY}),
    ("/v1/embeddings", {"model": "leak-key", "input": "hi"}, {"authorization": f"Bearer {KEY}"}),
    ("/v1/embeddings", {"model": "leak-key-gzip", "input": "hi"}, {"authorization": f"Bearer {KEY}"}),
])
def test_every_route_masks_the_key_in_provider_errors(injecting, path, body, headers):
    response = httpx.post(injecting + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 401 and "Incorrect API key provided: [masked]." in response.text
    assert leaks(response.text, UPSTREAM_KEY, KEY) == []


def test_a_litellm_route_error_is_masked_for_the_client_the_log_and_the_spans(injecting, proxy_factory, receiver):
    response = httpx.post(injecting + "/v1/chat/completions", json=chat("openai/leak-key-full"),
                          headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert response.status_code == 401 and "[masked]" in response.json()["error"]["message"]
    assert leaks(response.text, ROUTE_KEY) == []
    deadline = time.monotonic() + 15
    while not any(b"[masked]" in p for p in receiver.payloads) and time.monotonic() < deadline:
        time.sleep(0.2)
    spans = b"".join(receiver.payloads).decode("utf-8", "replace")
    assert "[masked]" in spans  # the exception event of the upstream call carries the masked message
    assert leaks(spans, ROUTE_KEY, UPSTREAM_KEY, KEY) == []
    log = log_of(proxy_factory, injecting)
    assert "the provider refused the proxy's upstream key: HTTP 401" in log  # from the chat route's leak-key
    assert leaks(log, ROUTE_KEY, UPSTREAM_KEY, KEY) == []


def test_the_key_a_client_presents_is_masked_when_the_provider_echoes_it(proxy_factory):
    base = proxy_factory()  # no upstream key of its own: the client's key goes through
    for model in ("leak-key", "leak-key-full"):
        response = httpx.post(base + "/v1/chat/completions", json=chat(model),
                              headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=30)
        assert response.status_code == 401 and "Incorrect API key provided: [masked]." in response.text
        assert leaks(response.text, CLIENT_KEY) == []
    response = httpx.post(base + "/v1/embeddings", json={"model": "leak-key-gzip", "input": "hi"},
                          headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=30)
    assert response.status_code == 401 and response.headers["content-encoding"] == "gzip"  # compressed again
    assert "[masked]" in response.text and leaks(response.text, CLIENT_KEY) == []
