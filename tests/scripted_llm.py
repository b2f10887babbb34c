"""A scripted OpenAI-compatible chat server on loopback, standing in for a paid provider in tests.

It runs under uvicorn on a real socket in a background thread; `reply` decides each answer from the
request body, and every request is recorded for assertions.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from morphguard.detectors.sentences import SentencesSettings, shipped
from tests.servers import bound_socket

Reply = Callable[[dict[str, Any]], "str | tuple[int, dict[str, Any]] | dict[str, Any]"]


def completion(text: str, *, prompt_tokens: int | None = 11, completion_tokens: int | None = 7,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text},
                     "logprobs": {"content": logprobs} if logprobs else None}],
    }
    if prompt_tokens is not None:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + (completion_tokens or 0)}
    return body


class ScriptedLLM:
    def __init__(self, reply: Reply, delay_s: float = 0.0) -> None:
        self.reply = reply
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self._socket = bound_socket()  # the port is ours from here on, whatever else starts meanwhile
        self.port = self._socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    async def _chat(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        self.requests.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            out = self.reply(body)
        finally:
            self.in_flight -= 1
        if isinstance(out, str):
            return JSONResponse(completion(out))
        if isinstance(out, tuple):
            return JSONResponse(out[1], status_code=out[0])
        return JSONResponse(out)

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted LLM did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


def error(status: int, message: str = "scripted failure") -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "server_error", "code": status}}


def tag(text: str, name: str) -> str:
    """What a prompt holds between `<name>` and `</name>`."""
    match = re.search(rf"<{name}>\n?(.*?)\n?</{name}>", text, re.S)
    return match.group(1).strip() if match else ""


def asked_sentences(user: str) -> list[tuple[int, str]]:
    """The numbered sentences of a `sentences` prompt (its user message), without the hints that follow them."""
    return [(int(n), text) for n, text in re.findall(r"^(\d+)\. (.*?)(?: {3}\[.*)?$", tag(user, "answer"), re.M)]


Label = Callable[[str, str], "tuple[str, list[str]]"]


def sentences_reply(user: str, label: Label, whole: str | None = None, named: list[str] | None = None) -> str:
    """The `sentences` check's reply to its prompt: `label(sentence, passages)` gives each numbered sentence's
    verdict and the phrases named; the whole answer is `whole`, else UNSUPPORTED where any sentence is, with the
    phrases `named` for it."""
    passages = tag(user, "passages")
    entries = []
    for n, sentence in asked_sentences(user):
        verdict, phrases = label(sentence, passages)
        entries.append({"id": n, "verdict": verdict, "phrases": phrases})
    if whole is None:
        whole = "UNSUPPORTED" if any(e["verdict"] == "UNSUPPORTED" for e in entries) else "SUPPORTED"
    return json.dumps({"sentences": entries, "answer": whole, "unsupported": named or []})


def sentences_score(whole: bool, sentence: bool) -> float:
    """The `sentences` check's score (the shipped calibration of prose) where the judge's verdicts are words: the
    answer UNSUPPORTED as a whole or not, a sentence UNSUPPORTED or not."""
    parts = {"whole": float(whole), "worst": float(sentence)}
    return shipped().probability(parts, False, SentencesSettings().whole_weight)[0]


def lexical_label(sentence: str, passages: str) -> tuple[str, list[str]]:
    """SUPPORTED where the passages hold the sentence word for word; else UNSUPPORTED, naming each run of its words
    the passages never use (none named where every word is used, only not in that order)."""
    if sentence.rstrip(".").lower() in passages.lower():
        return "SUPPORTED", []
    known = {w.lower() for w in re.findall(r"[\w'-]+", passages)}
    runs: list[list[re.Match[str]]] = [[]]
    for word in re.finditer(r"[\w'-]+", sentence):
        if word.group().lower() in known:
            runs.append([])
        else:
            runs[-1].append(word)
    return "UNSUPPORTED", [sentence[run[0].start():run[-1].end()] for run in runs if run]
