"""A claim classifier served over HTTP: Hugging Face Text Embeddings Inference or vLLM's pooling endpoints.

- `tei`: `POST /predict` with `{"inputs": [[premise, hypothesis], ...], "truncate": true}` (a text alone where a
  template makes one); the reply is, per input, every label with its probability: `[[{"label", "score"}, ...], ...]`
  (`[{"label", "score"}, ...]` for a single input). `verifier.label` is read by name, or by index as `LABEL_i`.
- `vllm-classify`: `POST /classify` with `{"model", "input": [text, ...], "truncate_prompt_tokens"}`; the reply's
  `data` holds per input its `index` and `probs`, every label's probability in index order. One text per input, so
  a template makes it of premise and hypothesis; `verifier.label` is read as an index.
- `vllm-score`: `POST /score` with `{"model", "text_1": [premise, ...], "text_2": [hypothesis, ...],
  "truncate_prompt_tokens"}`, pairs matched in order; the reply's `data` holds per pair its `index` and `score`, read
  as the probability of supported (a cross-encoder with one output, which vLLM passes through a sigmoid).

Requests follow the judge's rules (`llm.client.retried`): tried `judge.max_attempts` times on a timeout
(`judge.timeout_s` per try), a dropped connection, 408, 429 or a 5xx, with a random exponential backoff; at most
`judge.concurrency` at once, the places taken by the checks' clients in turn (`fairness.FairLimit`); each request
draws one call on the check's budget and is a GenAI client span (`predict`, `classify` or `score` and the model)
with the judge's metrics, as a judge call is. One HTTP client per verifier and event loop keeps its connections
between checks; `aclose` closes it. A server counts tokens itself: windows are sized here by an estimate of four
characters a token, and the server is asked to truncate what still runs over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
from opentelemetry import trace

from morphguard import telemetry
from morphguard.config import VerifierSettings
from morphguard.errors import LLMError
from morphguard.fairness import FairLimit
from morphguard.llm.client import TransientLLMError, reserve, retried, spend, together
from morphguard.llm.verifiers import Text, TokenScore, label_index

CHARS_PER_TOKEN = 4
PATHS = {"tei": "/predict", "vllm-classify": "/classify", "vllm-score": "/score"}
PROVIDERS = {"tei": "tei", "vllm-classify": "vllm", "vllm-score": "vllm"}  # gen_ai.provider.name


class ServedVerifier:
    def __init__(self, settings: VerifierSettings) -> None:
        judge = settings.judge
        assert judge.api_base is not None
        self.settings = settings
        self.name = judge.model
        self.url = judge.api_base.rstrip("/") + PATHS[judge.runtime]
        self.operation = PATHS[judge.runtime].lstrip("/")
        address = urlsplit(self.url)
        self.server = (address.hostname or "", address.port or (443 if address.scheme == "https" else 80))
        # per event loop (a client and its pool belong to the loop they were made in): the client and the places
        self._loop: tuple[int, httpx.AsyncClient, FairLimit] | None = None

    def length(self, text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)

    async def hallucinated(self, texts: Sequence[tuple[str, str]]) -> list[list[TokenScore]]:
        raise LLMError("a served verifier is a claim classifier: token classifiers run in process")

    def calls(self, texts: Sequence[Text]) -> int:
        return len(self._parts(texts))

    def _parts(self, texts: Sequence[Text]) -> list[list[Text]]:
        """The texts in requests of `verifier.batch`."""
        size = self.settings.batch
        parts = [list(texts[i:i + size]) for i in range(0, len(texts), size)]
        if self.settings.judge.runtime == "tei":
            # TEI reads a list of two texts as one pair: a part of two lone texts goes as two requests
            parts = [q for p in parts for q in ([[t] for t in p] if len(p) == 2 and p[0][1] is None else [p])]
        return parts

    async def supported(self, texts: Sequence[Text]) -> list[float]:
        parts = self._parts(texts)
        reserve(len(parts))  # past the check's cap: fail before sending any
        found = await together(self._ask(part) for part in parts)
        return [p for part in found for p in part]

    async def aclose(self) -> None:
        """Close the client (and its connections) of the running loop."""
        if self._loop is not None and self._loop[0] == id(asyncio.get_running_loop()):
            await self._loop[1].aclose()
        self._loop = None

    def _client(self) -> tuple[httpx.AsyncClient, FairLimit]:
        loop = id(asyncio.get_running_loop())
        if self._loop is None or self._loop[0] != loop:
            key = self.settings.judge.api_key
            headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
            self._loop = (loop, httpx.AsyncClient(timeout=self.settings.judge.timeout_s, headers=headers),
                          FairLimit(self.settings.judge.concurrency))
        return self._loop[1], self._loop[2]

    async def _ask(self, texts: list[Text]) -> list[float]:
        body = self._body(texts)
        spend()

        async def once() -> list[float]:
            client, limit = self._client()
            async with limit.slot():
                return self._read(await self._post(client, body), len(texts))

        return await retried(once, self.settings.judge.max_attempts, f"verifier {self.name}")

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Any:
        """One request inside its GenAI client span, recorded in the judge's metrics as a judge call is."""
        provider = PROVIDERS[self.settings.judge.runtime]
        span = telemetry.start_chat_span(self.name, provider, "judge", server=self.server, operation=self.operation)
        started = time.perf_counter()

        def record(answered: bool, error_type: str | None = None) -> None:
            telemetry.record_chat(span, provider=provider, role="judge", request_model=self.name,
                                  response_model=self.name if answered else None, input_tokens=None,
                                  output_tokens=None, seconds=time.perf_counter() - started, error_type=error_type,
                                  server=self.server, operation=self.operation)

        with trace.use_span(span, end_on_exit=True):
            try:
                reply = await _post(client, self.url, body, self.name)
            except Exception as exc:
                record(False, type(exc).__qualname__)
                raise
            record(True)
            return reply

    def _body(self, texts: list[Text]) -> dict[str, Any]:
        runtime, limit = self.settings.judge.runtime, self.settings.max_tokens
        if runtime == "tei":
            inputs = [[a, b] if b is not None else a for a, b in texts]
            return {"inputs": inputs if len(inputs) > 1 else inputs[0], "truncate": True}
        if runtime == "vllm-classify":
            return {"model": self.name, "input": [a for a, _ in texts], "truncate_prompt_tokens": limit}
        return {"model": self.name, "text_1": [a for a, _ in texts], "text_2": [b or "" for _, b in texts],
                "truncate_prompt_tokens": limit}

    def _read(self, reply: Any, count: int) -> list[float]:
        """P(supported) of each input, from the server's reply; LLMError where it is not the documented shape."""
        try:
            if self.settings.judge.runtime == "tei":
                rows = reply if count > 1 else [reply]
                if len(rows) != count:
                    raise ValueError(f"{len(rows)} predictions for {count} inputs")
                return [self._tei_label(row) for row in rows]
            data = sorted(reply["data"], key=lambda d: int(d["index"]))
            if [int(d["index"]) for d in data] != list(range(count)):
                raise ValueError(f"the indices {[d['index'] for d in data]} for {count} inputs")
            if self.settings.judge.runtime == "vllm-score":
                return [float(d["score"]) for d in data]
            return [float(d["probs"][label_index(self.settings.label, [str(i) for i in range(len(d["probs"]))])])
                    for d in data]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise LLMError(f"verifier {self.name}: {self.url} answered in another shape ({exc})") from None

    def _tei_label(self, row: list[dict[str, Any]]) -> float:
        """The configured label's probability among a TEI prediction's labels (by name, or LABEL_i for index i)."""
        scores = {str(p["label"]).lower(): float(p["score"]) for p in row}
        wanted = self.settings.label.strip().lower()
        for name in (wanted, f"label_{wanted}"):
            if name in scores:
                return scores[name]
        raise ValueError(f"verifier.label {self.settings.label!r} is not among the labels {sorted(scores)}")


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any], name: str) -> Any:
    """One request: its JSON reply; TransientLLMError where trying again may help, LLMError where it cannot."""
    try:
        response = await client.post(url, json=body)
    except httpx.TimeoutException as exc:
        raise TransientLLMError(f"verifier {name}: {type(exc).__name__}") from TimeoutError()
    except httpx.TransportError as exc:
        raise TransientLLMError(f"verifier {name}: {type(exc).__name__}") from exc
    status = response.status_code
    if status == 408 or status == 429 or status >= 500:
        raise TransientLLMError(f"verifier {name}: HTTP {status}")
    if status >= 400:
        raise LLMError(f"verifier {name}: HTTP {status}: {response.text[:300]}")
    try:
        return response.json()
    except ValueError:
        raise LLMError(f"verifier {name}: the reply is not JSON") from None
