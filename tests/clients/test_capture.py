"""`VerdictCapture` on a bare httpx client: it finds the verdict of answers and streams as the client reads
them, keys it by the answer's request id, keeps the latest `keep`, and leaves the bytes unchanged."""

from __future__ import annotations

import asyncio
import json

import httpx

from morphguard.integrations.clients import VerdictCapture
from tests.clients.conftest import QUESTION, SYSTEM

BODY = {"model": "hallucinated", "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": QUESTION}]}


def test_answers_and_streams_are_read_without_being_changed(annotate_proxy):
    capture = VerdictCapture(keep=2)
    with httpx.Client(base_url=annotate_proxy, event_hooks=capture.hooks, timeout=60) as client:
        answer = client.post("/v1/chat/completions", json=BODY)
        first = answer.headers["x-morphguard-request-id"]
        assert capture.of(first) == answer.json()["morphguard"] == capture.last
        with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: {")]
        verdict = json.loads(lines[-1][6:])["morphguard"]
        assert capture.last == verdict and capture.of(verdict["request_id"]) == verdict
        client.post("/v1/chat/completions", json=BODY)
    assert capture.of(first) is None  # only the latest two are kept


def test_the_async_hooks(annotate_proxy):
    capture = VerdictCapture()

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(base_url=annotate_proxy, event_hooks=capture.async_hooks,
                                     timeout=60) as client:
            return await client.post("/v1/responses", json={"model": "hallucinated", "instructions": SYSTEM,
                                                            "input": QUESTION})

    response = asyncio.run(go())
    assert capture.last == response.json()["morphguard"] and capture.last["flagged"]


def test_an_answer_without_a_verdict_leaves_none(annotate_proxy):
    capture = VerdictCapture()
    with httpx.Client(base_url=annotate_proxy, event_hooks=capture.hooks, timeout=60) as client:
        assert client.get("/v1/models").status_code == 200
    assert capture.last is None
