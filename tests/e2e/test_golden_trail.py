"""What a fixed set of requests leaves behind, compared with a recorded golden file: each response's status, its
`x-morphguard-*` headers, the verdict and text the client reads, and the request's audit row.

It guards the product's outward behaviour through changes of its inside: a refactor that moves any header, verdict
field or audit column shows here as a diff of a named request. The set covers the three APIs, whole and streamed,
every action (`annotate`, `block`, `highlight`, `cite`, `regenerate`), a topic's own threshold, a request without
context, one the proxy refuses, several choices, the check API and Portkey's webhook, the async mode and the
buffered stream mode. The proxies run under uvicorn against the scripted provider, whose judge answers by a lexical
rule, so every verdict is known in advance.

What varies from run to run is left out, and only that: ids, times, latencies and trace ids; how much of a stream
left before its verdict (`released_*`: it depends on when the prefix check ends against the upstream's pace); and
the judge's token counts (the prompt carries a request's own ids). After an intended change of behaviour, write the
file again with `MORPHGUARD_GOLDEN=write pytest tests/e2e/test_golden_trail.py -n 0` and review its diff.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

GOLDEN = Path(__file__).parent / "golden" / "trail.json"
PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
SAFE = "Please ask your doctor."
KEY = "sk-golden-0123"
TENANTS = {"general": "annotate", "strict": "block", "marked": "highlight", "cited": "cite", "again": "regenerate"}
# A row's columns that differ between two runs of the same request; see the module's text.
VARYING = {"time", "request_id", "trace_id", "latency_ms", "text_kept_until", "released_chars", "released_score",
           "released_flagged", "cost", "id"}
IDS = re.compile(r"\b(chatcmpl|resp|msg|rs|fc|call|item|toolu|mg)[-_][A-Za-z0-9_-]+")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{32}\b")


def _policy() -> dict[str, Any]:
    profiles: dict[str, Any] = {name: {"threshold": 0.5, "action": action, "topics": {}}
                                for name, action in TENANTS.items()}
    profiles["general"]["topics"] = {"medicines": {"threshold": 0.175, "action": "highlight"}}
    profiles["strict"]["safe_message"] = SAFE
    return {
        "profiles": profiles,
        "topics": {"medicines": {"keywords": ["ibuprofen"]}},
        "routes": [{"profile": name, "headers": {"x-tenant": name}} for name in TENANTS if name != "general"],
        "highlight": {"open": "[!", "close": "!]"},
        "audit": {"store_text": "full"},
    }


@pytest.fixture(scope="module")
def proxies(proxy_factory) -> dict[str, str]:
    """Three proxies of one policy, the scripted provider their upstream and judge: inline with the default stream
    mode, async, and buffering streams."""
    def start(**proxy: Any) -> str:
        return proxy_factory(policy=_policy(), keys=[KEY], upstream={"timeout_s": 5}, **proxy)
    return {"inline": start(), "async": start(mode="async"), "buffer": start(stream_mode="buffer")}


def _body(api: str, model: str, stream: bool, context: bool = True) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "stream": stream}
    if context:
        body["morphguard"] = {"context": PASSAGE}
    if api == "chat":
        return "/v1/chat/completions", body | {"messages": [{"role": "user", "content": QUESTION}]}
    if api == "responses":
        return "/v1/responses", body | {"input": QUESTION}
    return "/v1/messages", body | {"max_tokens": 100, "messages": [{"role": "user", "content": QUESTION}]}


def _requests() -> list[tuple[str, str, str, Any, str]]:
    """(name, proxy, path, body, tenant) of every request of the set, in the order they are sent."""
    out = []
    for tenant in TENANTS:
        for api in ("chat", "responses", "messages"):
            for model in ("faithful", "hallucinated"):
                for stream in (False, True):
                    path, body = _body(api, model, stream)
                    out.append((f"{tenant}-{api}-{model}-{'streamed' if stream else 'whole'}", "inline", path,
                                body, tenant))
    for tenant in ("general", "strict"):
        for stream in (False, True):
            path, body = _body("chat", "two-choices", stream)
            out.append((f"{tenant}-chat-two-choices-{'streamed' if stream else 'whole'}", "inline", path, body,
                        tenant))
    out.append(("general-chat-no-context", "inline", *_body("chat", "faithful", False, context=False), "general"))
    out.append(("general-chat-refused", "inline", "/v1/chat/completions", {"model": "faithful", "messages": 3},
                "general"))
    check = {"question": QUESTION, "context": [PASSAGE]}
    for tenant in ("general", "strict"):
        for answer in ("faithful", "hallucinated"):
            text = PASSAGE if answer == "faithful" else "Ibuprofen is safe throughout pregnancy."
            out.append((f"{tenant}-check-{answer}", "inline", "/v1/check", check | {"answer": text}, tenant))
            portkey = {"request": {"json": {"model": "gpt-4o-mini", "messages": [
                {"role": "system", "content": f"<context>{PASSAGE}</context>"},
                {"role": "user", "content": QUESTION}]}},
                "response": {"json": {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}},
                "eventType": "afterRequestHook", "requestType": "chatComplete"}
            out.append((f"{tenant}-portkey-{answer}", "inline", "/v1/check/portkey", portkey, tenant))
    for name in ("async", "buffer"):
        for tenant in ("general", "strict"):
            for api in ("chat", "responses", "messages"):
                for stream in (False, True):
                    path, body = _body(api, "hallucinated", stream)
                    out.append((f"{name}-{tenant}-{api}-{'streamed' if stream else 'whole'}", name, path, body,
                                tenant))
    return out


def _plain(text: str) -> str:
    return UUID.sub("<uuid>", IDS.sub(lambda m: f"{m.group(1)}-<id>", text))


def _stable(value: Any) -> Any:
    """`value` with what varies between runs written as placeholders."""
    if isinstance(value, dict):
        return {k: ("<varies>" if k in VARYING | {"created", "created_at", "system_fingerprint", "usage"}
                    else _stable(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str):
        return _plain(value)
    return value


def _events(text: str) -> list[Any]:
    """A stream's events in order, each its JSON payload (or `[DONE]`), with the text deltas of one kind joined:
    where the stream cut its text depends on timing, what it sent in all does not."""
    out: list[Any] = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        event = data if data == "[DONE]" else json.loads(data)
        delta = _delta(event)
        if delta is None:
            out.append(_stable(event))
            continue
        if not (out and isinstance(out[-1], dict) and set(out[-1]) == {"text"}):
            out.append({"text": {}})
        index, text = delta
        out[-1]["text"][index] = out[-1]["text"].get(index, "") + text
    return out


def _delta(event: Any) -> tuple[str, str] | None:
    """The answer text an event adds, with the choice or block it goes to, or None for any other event."""
    if not isinstance(event, dict):
        return None
    if event.get("object") == "chat.completion.chunk" and event.get("choices"):
        choice = event["choices"][0]
        keys = set(choice) - {"index", "logprobs"}
        content = (choice.get("delta") or {}).get("content")
        plain = keys == {"delta"} or (keys == {"delta", "finish_reason"} and choice["finish_reason"] is None)
        if plain and set(choice["delta"]) == {"content"} and content is not None:
            return str(choice["index"]), content
        return None
    if event.get("type") == "response.output_text.delta":
        return f"{event.get('output_index')}.{event.get('content_index')}", event["delta"]
    if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
        return str(event["index"]), event["delta"]["text"]
    return None


def _response(response: httpx.Response, stream: bool) -> dict[str, Any]:
    headers = {k: _plain(v) for k, v in sorted(response.headers.items())
               if k.startswith("x-morphguard-") and k != "x-morphguard-request-id"}
    out: dict[str, Any] = {"status": response.status_code, "headers": headers}
    if stream and response.status_code == 200:
        out["events"] = _events(response.text)
    else:
        out["body"] = _stable(response.json())
    return out


def _row(folder: Path, request_id: str, wait: bool) -> dict[str, Any] | None:
    deadline = time.monotonic() + (15 if wait else 0)
    while True:
        with sqlite3.connect(folder / "audit.db") as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM decisions WHERE request_id = ?", (request_id,)).fetchone()
        if row is not None or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if row is None:
        return None
    return {k: _stable(json.loads(v) if k in {"factoids", "explanation"} and v else v)
            for k, v in dict(row).items() if k not in VARYING}


def _request_id(text: str) -> str | None:
    """The request id a response's verdict carries, where no header does (a stream's last event, a gateway's data)."""
    found = re.findall(r'"request_id":\s*"([^"]+)"', text)
    return found[-1] if found else None


def _trail(proxies: dict[str, str], folders: dict[str, Path]) -> dict[str, Any]:
    trail = {}
    for name, proxy, path, body, tenant in _requests():
        headers = {"authorization": f"Bearer {KEY}", "x-tenant": tenant}
        response = httpx.post(proxies[proxy] + path, json=body, headers=headers, timeout=60)
        stream = isinstance(body, dict) and body.get("stream") is True
        entry = _response(response, stream)
        request_id = response.headers.get("x-morphguard-request-id") or _request_id(response.text)
        entry["row"] = _row(folders[proxy], request_id, wait=True) if request_id else None
        trail[name] = entry
    return trail


def test_every_request_leaves_the_recorded_trail(proxies, proxy_factory):
    folders = {name: proxy_factory.folders[base] for name, base in proxies.items()}
    trail = _trail(proxies, folders)
    if os.environ.get("MORPHGUARD_GOLDEN") == "write":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(trail, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(trail) == sorted(golden)
    changed = [name for name in golden if trail[name] != golden[name]]
    for name in changed:
        print(f"--- {name}\nrecorded: {json.dumps(golden[name], sort_keys=True)}\n"
              f"now:      {json.dumps(trail[name], sort_keys=True)}")
    assert changed == [], f"{len(changed)} of {len(golden)} requests leave another trail: {changed}"
