"""The guard cannot be walked around: every finding of the security review, replayed against the proxy
under uvicorn with raw HTTP (http.client sends paths exactly as written; httpx would tidy them)."""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import threading
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from morphguard.policy.actions import MAX_CITATIONS

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
KEY = "mg-key-1"
UPSTREAM_KEY = "sk-upstream-secret"


@pytest.fixture(scope="module")
def guarded(proxy_factory) -> str:
    """Blocks flagged answers, injects its own upstream key, stores texts in the audit trail."""
    return proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}},
                                              "clinic": {"action": "block", "threshold": 0.3}},
                                 "routes": [{"profile": "clinic", "path_prefix": "/clinic"}],
                                 "audit": {"store_text": "full"}},
                         stream_mode="buffer", upstream={"api_key": UPSTREAM_KEY}, keys=[KEY],
                         unchecked_routes=["completions"])


def raw(base: str, method: str, path: str, body: object = None, headers: list[tuple[str, str]] | None = None,
        timeout: float = 30) -> tuple[int, dict, bytes]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.putrequest(method, path, skip_accept_encoding=True)
    for name, value in headers or [("authorization", f"Bearer {KEY}"), ("content-type", "application/json")]:
        conn.putheader(name, value)
    if data is not None:
        conn.putheader("content-length", str(len(data)))
    conn.endheaders(data)
    response = conn.getresponse()
    out = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return out


def chat_body(model: str = "hallucinated", question: str = QUESTION, **ours: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": question}],
            "morphguard": {"context": PASSAGE, **ours}}


def audit_rows(proxy_factory, base: str) -> list[dict]:
    with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM decisions ORDER BY id")]


def is_openai_error(data: bytes) -> bool:
    error = json.loads(data).get("error")
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= error.keys()


BYPASSES = ["/v1//chat/completions", "/v1/chat/completions/", "/v1/./chat/completions", "/v1/chat/./completions",
            "//v1/chat/completions", "/v1/chat//completions", "/v1/%2e/chat/completions",
            "/clinic/v1//chat/completions", "/clinic//v1/chat/completions/"]


@pytest.mark.parametrize("path", BYPASSES)
def test_no_spelling_of_the_chat_route_skips_the_check(guarded, proxy_factory, provider, path):
    before = len(audit_rows(proxy_factory, guarded))
    status, headers, data = raw(guarded, "POST", path, chat_body())
    if status == 200:  # reached the chat route: checked and blocked like the canonical spelling
        completion = json.loads(data)
        assert completion["morphguard"]["checked"] and completion["morphguard"]["action"] == "block"
        assert completion["choices"][0]["finish_reason"] == "stop" and completion["choices"][0]["message"]["refusal"]
        assert len(audit_rows(proxy_factory, guarded)) == before + 1
    else:
        assert 400 <= status < 500 and is_openai_error(data)


@pytest.mark.parametrize("template", [
    "/v1/http://127.0.0.1:{port}/steal", "/v1/http:%2F%2F127.0.0.1:{port}/steal", "/x/v1/http://127.0.0.1:{port}/steal",
    "/v1/https:/127.0.0.1:{port}/steal", "/v1/models/../../../http://127.0.0.1:{port}/steal", "/v1/../../admin",
    "/v1/%2e%2e/%2e%2e/admin", "/v1/models/%2e%2e/%2e%2e/admin", "/v1//127.0.0.1:{port}/steal",
    "/v1/models%00/x", "/v1/models\\..\\admin"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_pass_through_reaches_only_the_upstream_under_its_base(guarded, provider, attacker, template, method):
    port, seen = attacker
    status, _, data = raw(guarded, method, template.format(port=port), {} if method == "POST" else None)
    assert 400 <= status < 500 and is_openai_error(data)
    assert seen == []  # the attacker's server got nothing, least of all the upstream key
    others = httpx.get(provider.removesuffix("/v1") + "/_others").json()
    assert not any("admin" in o["path"] or "steal" in o["path"] for o in others)


def test_an_upstream_redirect_is_not_followed_and_its_cookies_neither_kept_nor_passed_on(guarded, proxy_factory,
                                                                                          provider):
    status, _, data = raw(guarded, "POST", "/v1/chat/completions", chat_body(model="redirect"))
    assert status == 502 and is_openai_error(data)  # not a chat completion: never a silent pass
    assert audit_rows(proxy_factory, guarded)[-1]["reason"] == "upstream_malformed"
    others = httpx.get(provider.removesuffix("/v1") + "/_others").json()
    assert not any(o["path"].startswith("/stolen") for o in others)  # the key went nowhere else
    status, headers, _ = raw(guarded, "POST", "/v1/chat/completions", chat_body(model="set-cookie"))
    assert status == 200 and "set-cookie" not in headers  # nor set on the proxy's origin, the console's
    assert raw(guarded, "POST", "/v1/chat/completions", chat_body(model="faithful"))[0] == 200
    seen = httpx.get(provider.removesuffix("/v1") + "/_requests").json()
    last = [r for r in seen if r["body"].get("model") == "faithful"][-1]
    assert last["cookie"] is None  # a cookie the provider set for one client never rides on another's request


CLIENT_ONLY = [("cookie", "morphguard_review=a-reviewers-session; theme=dark"), ("x-forwarded-for", "203.0.113.7"),
               ("forwarded", "for=203.0.113.7;proto=https"), ("x-real-ip", "203.0.113.7")]


def test_the_clients_cookies_and_forwarding_headers_never_reach_the_provider(guarded, provider):
    """A browser that holds the review console's session (served on the same origin by `serve`) sends that cookie
    on every request to the proxy; neither it nor what a reverse proxy says about the client goes upstream."""
    sent = [("authorization", f"Bearer {KEY}"), ("content-type", "application/json"), *CLIENT_ONLY]
    root = provider.removesuffix("/v1")
    assert raw(guarded, "POST", "/v1/chat/completions", chat_body(model="faithful"), headers=sent)[0] == 200
    assert httpx.get(root + "/_requests").json()[-1]["cookie"] is None
    native = {"model": "faithful", "input": QUESTION, "morphguard": {"context": PASSAGE}}
    assert raw(guarded, "POST", "/v1/responses", native, headers=sent)[0] == 200
    native = {"model": "faithful", "max_tokens": 50, "messages": [{"role": "user", "content": QUESTION}],
              "morphguard": {"context": PASSAGE}}
    assert raw(guarded, "POST", "/v1/messages", native, headers=sent)[0] == 200
    for seen in httpx.get(root + "/_native").json()[-2:]:
        assert not {name for name, _ in CLIENT_ONLY} & set(seen["headers"]), seen["path"]
        key = seen["headers"].get("x-api-key") or seen["headers"]["authorization"].removeprefix("Bearer ")
        assert key == UPSTREAM_KEY  # what the provider needs still goes
    assert raw(guarded, "GET", "/v1/files", headers=sent)[0] == 200  # the pass-through
    assert httpx.get(root + "/_others").json()[-1] == {"method": "GET", "path": "/v1/files",
                                                      "authorization": f"Bearer {UPSTREAM_KEY}", "cookie": None}


def test_allow_listed_paths_pass_through_with_the_upstream_key(guarded, provider):
    status, _, data = raw(guarded, "GET", "/v1/models")
    assert status == 200 and json.loads(data)["object"] == "list"
    status, _, _ = raw(guarded, "GET", "/v1/models", headers=[("authorization", "Bearer wrong")])
    assert status == 401


def test_generation_routes_that_cannot_be_checked_are_refused_or_pass_audited(guarded, proxy_factory, provider):
    status, _, data = raw(guarded, "POST", "/v1/assistants", {"model": "hallucinated", "instructions": QUESTION})
    assert status == 403 and json.loads(data)["error"]["code"] == "unchecked_route"
    status, _, data = raw(guarded, "GET", "/v1/responses/resp_123")  # a stored response, never checked here
    assert status == 403 and json.loads(data)["error"]["code"] == "unchecked_route"
    others = httpx.get(provider.removesuffix("/v1") + "/_others").json()
    assert not any(o["path"].endswith(("/assistants", "/resp_123")) for o in others)
    status, _, _ = raw(guarded, "POST", "/v1/completions", {"model": "hallucinated", "prompt": QUESTION})
    assert status == 200  # listed in proxy.unchecked_routes: passes, and the audit says so
    assert audit_rows(proxy_factory, guarded)[-1]["reason"] == "unchecked_route"


def test_unknown_paths_and_methods_get_openai_shaped_errors(guarded):
    for method, path, expected in (("GET", "/nope", 404), ("GET", "/healthz/x", 404), ("POST", "/healthz", 405),
                                   ("GET", "/v1/chat/completions", 403), ("GET", "/v1/nothing-here", 404)):
        status, _, data = raw(guarded, method, path)
        assert status == expected and is_openai_error(data), (method, path)


def test_duplicate_credentials_or_policy_headers_are_refused(guarded):
    for name in ("authorization", "x-morphguard-topic"):
        status, _, data = raw(guarded, "POST", "/v1/chat/completions", chat_body(), headers=[
            ("authorization", f"Bearer {KEY}"), ("content-type", "application/json"), (name, "Bearer a"),
            *([(name, "Bearer b")] if name != "authorization" else [])])
        assert status == 400 and name in json.loads(data)["error"]["message"]


def test_a_request_cannot_loosen_policy(guarded):
    # the clinic profile's threshold 0.3 and the tagged healthcare topic hold whatever the request says
    for extra in ({"topic": "none"}, {"topic": "general"}, {"policy": "general"}):
        status, _, data = raw(guarded, "POST", "/clinic/v1/chat/completions", chat_body(**extra))
        verdict = json.loads(data)["morphguard"]
        assert status == 200 and verdict["profile"] == "clinic" and verdict["threshold"] == 0.3
    status, _, data = raw(guarded, "POST", "/v1/chat/completions", chat_body(detector="length"))
    assert status == 400 and json.loads(data)["error"]["param"] == "morphguard.detector"


@pytest.mark.parametrize("body, param", [
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text"),
    ({"model": "m", "messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ({"model": 3, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "morphguard": {"topic": ["x"]}},
     "morphguard.topic"),
])
def test_malformed_fields_are_a_400_naming_the_field(guarded, body, param):
    status, _, data = raw(guarded, "POST", "/v1/chat/completions", body)
    assert status == 400 and json.loads(data)["error"]["param"] == param


@pytest.mark.parametrize("raw_body", [
    b'{"model": "m", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": '
    + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b"\xff\xfe not json",
])
def test_hostile_json_is_a_400_not_a_crash(guarded, raw_body):
    status, headers, data = raw(guarded, "POST", "/v1/chat/completions", raw_body)
    assert status == 400 and is_openai_error(data)


def test_lone_surrogates_and_non_ascii_headers_are_answered_and_audited(guarded, proxy_factory):
    before = len(audit_rows(proxy_factory, guarded))
    body = json.dumps(chat_body(model="faithful", question="Ibuprofen \ud800 in pregnancy?")).encode()
    assert b"\\ud800" in body
    status, _, data = raw(guarded, "POST", "/v1/chat/completions", body, headers=[
        ("authorization", f"Bearer {KEY}"), ("content-type", "application/json"), ("x-note", "caf\xe9")])
    assert status == 200 and json.loads(data)["morphguard"]["checked"]
    rows = audit_rows(proxy_factory, guarded)
    assert len(rows) == before + 1 and rows[-1]["question"].startswith("Ibuprofen \ufffd")
    # and from the upstream: an answer with a lone surrogate is checked like any other (here: blocked)
    status, _, data = raw(guarded, "POST", "/v1/chat/completions", chat_body(model="surrogate"))
    verdict = json.loads(data)["morphguard"]
    assert status == 200 and verdict["checked"] and verdict["action"] == "block"


@pytest.mark.parametrize("model, status, code", [("content-int", 502, "upstream_malformed"),
                                                 ("nan", 502, "upstream_malformed")])
def test_a_malformed_upstream_answer_is_a_502_and_the_audit_says_so(guarded, proxy_factory, model, status, code):
    got, _, data = raw(guarded, "POST", "/v1/chat/completions", chat_body(model=model))
    assert got == status and json.loads(data)["error"]["code"] == code
    row = audit_rows(proxy_factory, guarded)[-1]
    assert (row["model"], row["reason"], row["checked"]) == (model, code, 0)


def test_a_pathological_context_does_not_stall_other_clients(guarded):
    """160 KB of unclosed tags and a 4 MB context: answered, and /healthz answers meanwhile."""
    hostile = {"model": "faithful", "messages": [{"role": "system", "content": "<context>" * 18_000},
                                                 {"role": "user", "content": QUESTION}]}
    big = chat_body(model="faithful")
    big["morphguard"]["context"] = [PASSAGE + " pregnancy dose " * 200] * 1_200  # ~3.9 MB
    results: list[int] = []

    def send(body: dict) -> None:
        results.append(raw(guarded, "POST", "/v1/chat/completions", body, timeout=60)[0])

    threads = [threading.Thread(target=send, args=(b,)) for b in (hostile, big)]
    for t in threads:
        t.start()
    health = []
    while any(t.is_alive() for t in threads):
        health.append(httpx.get(guarded + "/healthz", timeout=5).status_code)
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert results == [200, 200] or sorted(results) == [200, 200]
    assert health and set(health) == {200}


def test_an_answer_with_thousands_of_flagged_sentences_does_not_stall_other_clients(proxy_factory):
    """The `cite` action looks up a source for flagged statements: 4,000 of them, which a client gets by having the
    model repeat its message, took 54 s on the event loop one by one. Now at most `MAX_CITATIONS` are looked up, off
    the loop, and /healthz answers meanwhile."""
    base = proxy_factory(policy={"profiles": {"general": {"action": "cite", "topics": {}}}}, detector="grounding")
    context = " ".join(f"Kettle {i} is safe for adults." for i in range(4_000))
    said = " ".join(f"Kettle {i} is cheap in Paris." for i in range(4_000))
    body = {"model": "echo", "morphguard": {"context": context},  # echo repeats the last message, after the question
            "messages": [{"role": "user", "content": "Which kettles are cheap?"},
                         {"role": "assistant", "content": said}]}
    results: list[tuple[int, bytes]] = []
    sender = threading.Thread(target=lambda: results.append(
        raw(base, "POST", "/v1/chat/completions", body, timeout=120)[::2]))
    sender.start()
    health = []
    while sender.is_alive():
        health.append(httpx.get(base + "/healthz", timeout=5).status_code)
        time.sleep(0.05)
    sender.join()
    (status, data), = results
    completion = json.loads(data)
    assert status == 200 and completion["morphguard"]["action"] == "cite"
    assert completion["choices"][0]["message"]["content"].endswith(
        f"- and {4_000 - MAX_CITATIONS} more flagged statements, listed in the verdict.")
    assert health and set(health) == {200}


def test_uvicorn_parse_errors_are_openai_shaped(guarded):
    parts = urlsplit(guarded)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBroken Header\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and is_openai_error(body)


@pytest.mark.slow  # ten seconds or more of its own
def test_the_official_client_sees_stream_failures_as_errors(proxy_factory):
    base = proxy_factory(stream_mode="passthrough")
    c = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=30)
    stream = c.chat.completions.create(model="truncated", messages=[{"role": "user", "content": QUESTION}],
                                       stream=True, extra_body={"morphguard": {"context": PASSAGE}})
    with pytest.raises(openai.APIError) as err:
        list(stream)
    assert "ended before the answer was finished" in str(err.value)


def test_an_audit_row_that_cannot_be_written_is_counted_and_shown_in_readyz(proxy_factory):
    base = proxy_factory()
    assert httpx.get(base + "/readyz", timeout=10).json()["checks"].get("audit_failures") is None
    with sqlite3.connect(proxy_factory.folders[base] / "audit.db") as db:
        db.execute("DROP TABLE decisions")  # the store breaks under the running proxy
    status, _, data = raw(base, "POST", "/v1/chat/completions", chat_body(model="faithful"),
                          headers=[("content-type", "application/json")])
    assert status == 200 and json.loads(data)["morphguard"]["checked"]  # the client is still answered
    ready = httpx.get(base + "/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["checks"]["audit_failures"] == 1
    assert "audit record failed" in (proxy_factory.folders[base] / "proxy.log").read_text()
