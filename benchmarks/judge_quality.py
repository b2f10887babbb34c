"""How the check follows the judge's quality, without any API: scripted judges that answer the pipeline's real
prompts from the gold labels, with noise.

Each detector runs unchanged, over the real client (litellm, HTTP on loopback), against an oracle server. The
oracle reads each prompt the way a judge would be asked it, finds the answer sentence (or the whole answer) it
is about among the benchmark's items, and answers from the gold: a sentence is unsupported where it overlaps a
gold span, and the phrases it names are the gold spans' words within it; an answer is unsupported where the item
is labelled hallucinated, and the phrases named for it are every gold span's words (a false alarm names the first
sentence). The noise model at rate p:
- each item has a difficulty d, uniform in [0, 1), shared by every question about it;
- each verdict is flipped with probability 2·p·d (so p on average; hard items are the ones judges get wrong);
- its stated confidence (the log-probabilities the client reads) is 1 at p = 0, else 0.55 + 0.45·(1 − d);
- a reply is malformed (not JSON, no verdict) with probability p/5, once per reply whatever it is about.
The uniform model says how the check follows the judge's accuracy; it holds by construction at p = 0, where the
judge is the gold itself (AUROC 1 there says the plumbing works, not how good the check is). Real judges err in
correlated, content-dependent ways; `--judges realistic` answers with an error model of those (rates stated in
`Realistic`, seeded per item and question):
- a missed error, by what the gold span is: a number, date or unit (0.35), a negation (0.35), an entity (0.2), a
  qualifier or few words added to an otherwise supported sentence (0.5), anything else (0.15); half as often again
  in the second half of an answer (position bias);
- a false alarm on a supported sentence: 0.04, plus 0.15 where it holds a negation (the judge follows it wrongly)
  and 0.10 where the context is long (over 8,000 characters: a fact in the middle is lost);
- a whole answer is missed only where every one of its errors is, and falsely flagged as a sentence would be;
- over-confidence: a wrong verdict is stated with confidence 0.85-0.99, as sure as a right one (0.7-0.99);
- operational faults, per judge call: a refusal (1 %), malformed JSON (2 %), a 429 with Retry-After (2 %, once per
  call, then answered) and a reply slower than the client's timeout (0.5 %, once per call); the client retries as
  it does in production (`judge.max_attempts` 3, `judge.timeout_s` 5 under this model).
Where the oracle knows more than the prompt showed: it reads the gold whatever context it was sent, so a check
that sends a cut of the context (the spot check) is not punished for cutting away the evidence, and phrases it
names are exactly the annotators', which a real judge's would only approach.

Thresholds: F1 at the configured threshold (0.3), and at the threshold that maximises F1 on the fit half with
another noise seed; recall at the sensitive topics' threshold (0.175). Span F1 (character overlap, as in RAGTruth)
of the factoids at or above each threshold.

    python benchmarks/judge_quality.py [--noise 0,0.1,0.2,0.3] [--detectors sentences,direct,spotcheck,combined]
                                       [--datasets ragtruth-qa,...] [--limit N] [--delay 0.4]
                                       [--judges uniform,realistic]

Writes benchmarks/results/judge_quality.json and judge_quality.png. `--fit-calibration PATH` instead writes the
`sentences` check's calibration fitted on the fit halves under the realistic judge (the shipped one is
morphguard/detectors/sentences.json). `--delay` adds that many seconds to every
judge call (a fixed-latency API judge) and reports the check's p50 time, calls and tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from morphguard.config import Config
from morphguard.detectors import build_detector
from morphguard.detectors.text import sentences
from morphguard.errors import MorphguardError
from morphguard.eval import datasets, metrics
from morphguard.eval.items import Item
from morphguard.models import RagInput

HERE = Path(__file__).resolve().parent
SETS = ("ragtruth-qa", "ragtruth-summary", "ragtruth-data2txt", "contrast-qa")
DETECTORS = ("sentences", "direct", "spotcheck", "combined", "metarag:paper", "claims", "hierarchical")
THRESHOLD = 0.3
# A row's figures, in the order printed; with several draws (`--seeds`), each one's mean and spread too
DRAWN = ("auroc", "f1_at_0.3", "f1_at_fit", "recall_at_0.175", "span_f1", "span_f1_at_fit")
SENSITIVE = 0.175  # config.yaml's threshold for sensitive topics


def _tag(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.S)
    return match.group(1).strip() if match else ""


_NEGATION = re.compile(r"\b(?:not|no|never|none|nor|without|cannot)\b|n't\b", re.I)
_NUMBER = re.compile(r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|hundred|thousand|million|billion|"
                     r"january|february|march|april|may|june|july|august|september|october|november|december|"
                     r"percent|kg|km|mg|ml|miles?|hours?|minutes?|days?|weeks?|months?|years?)\b", re.I)
_ENTITY = re.compile(r"(?<!^)(?<![.!?]\s)\b[A-Z][a-z]+")


class Realistic:
    """How a capable but fallible judge errs: by the kind of error, where it sits, and how long the context is.
    Rates as in the module docstring; `kind` is read off the gold span's words."""

    MISS = {"number": 0.35, "negation": 0.35, "entity": 0.2, "qualifier": 0.5, "other": 0.15}
    FALSE_ALARM, NEGATED_ALARM, LONG_CONTEXT_ALARM, LONG_CONTEXT = 0.04, 0.15, 0.10, 8000
    LATE = 1.5  # misses in the second half of an answer, relative to the first
    REFUSAL, MALFORMED, THROTTLED, SLOW = 0.01, 0.02, 0.02, 0.005
    TIMEOUT_S = 5.0

    @staticmethod
    def kind(phrase: str, sentence: str) -> str:
        if _NUMBER.search(phrase):
            return "number"
        if _NEGATION.search(phrase):
            return "negation"
        if _ENTITY.search(phrase):
            return "entity"
        if len(phrase.split()) <= 4 and len(phrase) < 0.3 * max(len(sentence), 1):
            return "qualifier"
        return "other"

    def miss(self, phrases: list[str], sentence: str, late: bool) -> float:
        """The chance of calling an unsupported unit supported: it is missed only if each of its errors is."""
        chance = 1.0
        for phrase in phrases or [sentence]:
            chance *= self.MISS[self.kind(phrase, sentence)]
        return min(0.95, chance * (self.LATE if late else 1.0))

    def alarm(self, sentence: str, context_chars: int) -> float:
        """The chance of calling a supported unit unsupported."""
        return (self.FALSE_ALARM + (self.NEGATED_ALARM if _NEGATION.search(sentence) else 0.0)
                + (self.LONG_CONTEXT_ALARM if context_chars > self.LONG_CONTEXT else 0.0))


class Oracle:
    """Answers each prompt from the gold labels of `items`: with noise at rate `p` (seeded), or as `realistic` errs."""

    def __init__(self, items: list[Item], p: float, seed: int, delay: float,
                 realistic: Realistic | None = None) -> None:
        self.items, self.p, self.seed, self.delay, self.realistic = items, p, seed, delay, realistic
        self.calls = 0
        self.faults: dict[str, int] = {}  # operational faults served, by kind
        self._seen: set[str] = set()  # calls already given their one 429 or slow reply

    # --- finding what a prompt is about ---------------------------------------------------------------------

    def _item(self, text: str, prompt: str, others: tuple[str, ...] | list[str] = ()) -> tuple[Item, int] | None:
        """The item whose answer contains `text` (preferring one that also contains the prompt's `others`, then one
        whose question or context the prompt shows), and where. Six answers of one source can share a sentence."""
        found = [i for i in self.items if text and text in i.answer]
        if not found:
            return None
        # an edit that adds a sentence contains the original, which may be this sentence alone: exact only with the
        # others shown
        exact = [i for i in found if i.answer.strip() == text and all(o in i.answer for o in others)]
        if exact:
            return exact[0], exact[0].answer.find(text)
        whole = [i for i in found if all(o in i.answer for o in others)]
        if others:  # of the answers holding every sentence shown, the one with no sentence more
            whole = [i for i in whole if len(sentences(i.answer)) == len(others)] or whole
        shown = [i for i in whole or found
                 if i.question[:80] in prompt or any(p[:80] in prompt for p in i.passages if p)]
        item = (shown or whole or found)[0]
        return item, item.answer.find(text)

    def _difficulty(self, item: Item) -> float:
        return random.Random(f"{self.seed}:difficulty:{item.id}").random()

    def _verdict(self, item: Item, unit: str, truth: bool, start: int | None = None,
                 end: int | None = None) -> tuple[bool, float]:
        """The judge's verdict on "is it unsupported?" and its confidence in that verdict; [start, end) is the
        answer text asked about (None: the whole answer)."""
        draw = random.Random(f"{self.seed}:flip:{item.id}:{unit}")
        if self.realistic is not None:
            model = self.realistic
            s, e = (0, len(item.answer)) if start is None or end is None else (start, end)
            text = item.answer[s:e]
            if truth:
                phrases = self._gold(item, s, e) if item.spans is not None else []
                wrong = draw.random() < model.miss(phrases, text, late=s > len(item.answer) / 2)
            else:
                wrong = draw.random() < model.alarm(text, sum(len(p) for p in item.passages))
            confidence = draw.uniform(0.85, 0.99) if wrong else draw.uniform(0.7, 0.99)
            return truth != wrong, confidence
        d = self._difficulty(item)
        flipped = draw.random() < 2 * self.p * d
        confidence = 1.0 if self.p == 0 else 0.55 + 0.45 * (1 - d)
        return truth != flipped, confidence

    def _malformed(self, item: Item, unit: str) -> bool:
        rate = self.realistic.MALFORMED if self.realistic is not None else self.p / 5
        return random.Random(f"{self.seed}:malformed:{item.id}:{unit}").random() < rate

    def fault(self, body: dict[str, Any]) -> str | None:
        """The operational fault this call meets, if any: refused, throttled (429, once) or slow (once)."""
        if self.realistic is None:
            return None
        model, key = self.realistic, json.dumps(body["messages"], sort_keys=True)
        draw = random.Random(f"{self.seed}:fault:{key}").random()
        first = key not in self._seen
        self._seen.add(key)
        kind = None
        if draw < model.REFUSAL:
            kind = "refusal"
        elif first and draw < model.REFUSAL + model.THROTTLED:
            kind = "throttled"
        elif first and draw < model.REFUSAL + model.THROTTLED + model.SLOW:
            kind = "slow"
        if kind is not None:
            self.faults[kind] = self.faults.get(kind, 0) + 1
        return kind

    @staticmethod
    def _gold(item: Item, start: int, end: int) -> list[str]:
        """The gold spans' words within [start, end)."""
        out = []
        for span in item.spans or []:
            s, e = max(span.start, start), min(span.end, end)
            if e > s:
                out.append(item.answer[s:e].strip())
        return [t for t in out if t]

    def _sentence_truth(self, item: Item, start: int, end: int) -> tuple[bool, list[str]]:
        if item.spans is None:  # no span labels: the answer's label stands for each sentence
            return item.hallucinated, []
        phrases = self._gold(item, start, end)
        return bool(phrases), phrases

    # --- answering -----------------------------------------------------------------------------------------

    def answer(self, body: dict[str, Any]) -> tuple[str, list[tuple[str, str, float]]]:
        """The reply text, and the verdict tokens the log-probabilities weigh: (token, alternative, P(token))."""
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "The answer's sentences are numbered" in system:
            return self._sentences(user)
        if "strict fact checker" in system:
            return self._direct(user)
        if "one sentence of an answer" in system:
            return self._yes_no(_tag(user, "statement"), user)
        if "compare two sentences" in system:
            return self._yes_no(_tag(user, "restatement"), user)
        if "atomic factoids" in system:
            return self._decompose(user)
        if "of a factual statement for a metamorphic test" in system:
            return self._mutate(system, user)
        if "against reference passages" in system and "For the statement" in system:
            return self._verify(user)
        if "You audit an answer" in system:
            return self._claims(user)
        if "You split one sentence of an answer" in system:
            return json.dumps({"claims": [_tag(user, "sentence")]}), []
        if "You check one claim against numbered sentences" in system:
            return self._claim(user)
        raise ValueError(f"the oracle does not answer this prompt: {system[:80]}")

    def _sentences(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        entries, weighed = [], []
        whole: Item | None = None
        listed = [m for line in _tag(user, "answer").splitlines()
                  if (m := re.match(r"(\d+)\. (.*?)(?:   \[.*\])*$", line))]
        for match in listed:
            number, sentence = int(match.group(1)), match.group(2)
            where = self._item(sentence, user, [m.group(2) for m in listed])
            if where is None:
                entries.append({"id": number, "verdict": "SUPPORTED", "phrases": []})
                weighed.append(("SUPPORTED", "UNSUPPORTED", 0.5))
                continue
            item, at = where
            whole = whole or item
            truth, phrases = self._sentence_truth(item, at, at + len(sentence))
            said, confidence = self._verdict(item, f"s{at}", truth, at, at + len(sentence))
            verdict = "UNSUPPORTED" if said else "SUPPORTED"
            entries.append({"id": number, "verdict": verdict, "phrases": phrases if said and truth else
                            ([sentence] if said else [])})
            weighed.append((verdict, "SUPPORTED" if said else "UNSUPPORTED", confidence))
        overall, named = "SUPPORTED", []
        if whole is not None:  # the same question as `direct`'s, answered as the oracle answers that one
            if self._malformed(whole, "whole"):  # a reply is malformed or not as a whole, as `direct`'s is
                return "I could not check these sentences.", []
            said, confidence = self._verdict(whole, "whole", whole.hallucinated)
            overall, named = "UNSUPPORTED" if said else "SUPPORTED", self._named(whole, said)
            weighed.append((overall, "SUPPORTED" if said else "UNSUPPORTED", confidence))
        return json.dumps({"sentences": entries, "answer": overall, "unsupported": named}), weighed

    def _direct(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        where = self._item(_tag(user, "answer"), user)
        if where is None:
            return json.dumps({"verdict": "YES", "unsupported": []}), [("YES", "NO", 0.5)]
        item, _ = where
        said, confidence = self._verdict(item, "whole", item.hallucinated)
        if self._malformed(item, "whole"):
            return "Unclear.", []
        verdict = "NO" if said else "YES"
        return json.dumps({"verdict": verdict, "unsupported": self._named(item, said)}), [
            (verdict, "YES" if said else "NO", confidence)]

    def _named(self, item: Item, said: bool) -> list[str]:
        """The phrases named with a verdict that the whole answer is unsupported: the gold spans' words; a wrong
        verdict names something, as a wrong UNSUPPORTED sentence does: the answer's first sentence."""
        if not said:
            return []
        return (self._gold(item, 0, len(item.answer)) if item.hallucinated else [item.answer.split(". ")[0]])[:8]

    def _yes_no(self, sentence: str, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        where = self._item(sentence, user)
        if where is None:
            return "YES", [("YES", "NO", 0.5)]
        item, at = where
        truth, _ = self._sentence_truth(item, at, at + len(sentence))
        said, confidence = self._verdict(item, f"s{at}", truth, at, at + len(sentence))
        if self._malformed(item, f"s{at}"):
            return "Maybe.", []
        verdict = "NO" if said else "YES"
        return verdict, [(verdict, "YES" if said else "NO", confidence)]


    # --- MetaRAG: factoids are the answer's sentences; a variant carries its kind, so the verdict can be given ---

    def _decompose(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        answer = _tag(user, "answer")
        item = next((i for i in self.items if i.answer.strip() == answer), None)
        where = item or self._item(answer[:80], user)
        if where is None:
            return json.dumps({"factoids": [answer]}), []
        item = where if isinstance(where, Item) else where[0]
        return json.dumps({"factoids": [item.answer[s:e] for s, e in sentences(item.answer)][:32]}), []

    @staticmethod
    def _mutate(system: str, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        count = re.search(r"write (\d+) different", system)
        kind = "S" if "paraphrases" in system else "A"
        statement = _tag(user, "statement")
        return json.dumps({"statements": [f"{kind}{i}: {statement}"
                                          for i in range(1, int(count.group(1) if count else 2) + 1)]}), []

    def _verify(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        """A paraphrase is supported where its sentence is; a contradiction where its sentence is not."""
        statement = _tag(user, "statement")
        marked = re.match(r"([SA])(\d+): (.*)$", statement, re.S)
        kind, base = (marked.group(1), marked.group(3)) if marked else ("S", statement)
        where = self._item(base, user)
        if where is None:
            return json.dumps({"verdict": "NOT SURE", "reason": "oracle"}), []
        item, at = where
        unit = f"v{kind}{marked.group(2) if marked else 0}:{at}"
        truth, _ = self._sentence_truth(item, at, at + len(base))
        said, confidence = self._verdict(item, unit, truth, at, at + len(base))
        if self._malformed(item, unit):
            return "Hard to say.", []
        verdict = ("NO" if said else "YES") if kind == "S" else ("YES" if said else "NO")
        other = "YES" if verdict == "NO" else "NO"
        return json.dumps({"verdict": verdict, "reason": "oracle"}), [(verdict, other, confidence)]


    # --- claims and hierarchical: a claim is an answer sentence, labelled from the gold ------------------------

    def _claims(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        answer = _tag(user, "answer")
        item = next((i for i in self.items if i.answer.strip() == answer), None)
        if item is None:
            return json.dumps({"claims": []}), []
        if self._malformed(item, "claims"):
            return "No claims found.", []
        evidence = next((p.strip()[:40] for p in item.passages if p.strip()), "")
        claims, weighed = [], []
        for s, e in sentences(item.answer):
            truth, _ = self._sentence_truth(item, s, e)
            said, confidence = self._verdict(item, f"s{s}", truth, s, e)
            label = "unsupported" if said else "supported"
            claims.append({"text": item.answer[s:e], "label": label, "evidence": "" if said else evidence})
            weighed.append((label, "supported" if said else "unsupported", confidence))
        return json.dumps({"claims": claims}), weighed

    def _claim(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        claim = _tag(user, "claim")
        where = self._item(claim, user)
        if where is None:
            return json.dumps({"label": "baseless", "evidence": []}), []
        item, at = where
        truth, _ = self._sentence_truth(item, at, at + len(claim))
        said, confidence = self._verdict(item, f"s{at}", truth, at, at + len(claim))
        if self._malformed(item, f"h{at}"):
            return "Unclear.", []
        label = "baseless" if said else "entailed"
        return (json.dumps({"label": label, "evidence": [] if said else [1]}),
                [(label, "entailed" if said else "baseless", confidence)])


def _logprobs(text: str, weighed: list[tuple[str, str, float]]) -> dict[str, Any]:
    """The reply as tokens, each verdict its own token with the alternative the judge weighed."""
    tokens, cursor = [], 0
    for verdict, alternative, confidence in weighed:
        at = text.find(verdict, cursor)
        if at < 0:
            continue
        if at > cursor:
            tokens.append({"token": text[cursor:at], "logprob": 0.0, "top_logprobs": []})
        chosen, other = math.log(max(confidence, 1e-6)), math.log(max(1 - confidence, 1e-6))
        tokens.append({"token": verdict, "logprob": chosen, "top_logprobs": [
            {"token": verdict, "logprob": chosen}, {"token": alternative, "logprob": other}]})
        cursor = at + len(verdict)
    if cursor < len(text):
        tokens.append({"token": text[cursor:], "logprob": 0.0, "top_logprobs": []})
    return {"content": tokens}


def serve(oracle: Oracle) -> tuple[str, uvicorn.Server]:
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        oracle.calls += 1
        if oracle.delay:
            await asyncio.sleep(oracle.delay)
        fault = oracle.fault(body)
        if fault == "throttled":
            return JSONResponse({"error": {"message": "Rate limit reached", "type": "requests",
                                           "code": "rate_limit_exceeded"}}, status_code=429,
                                headers={"retry-after": "0.05"})
        if fault == "slow":
            await asyncio.sleep(Realistic.TIMEOUT_S + 1)
        text, weighed = ("I'm sorry, but I can't help with that.", []) if fault == "refusal" else oracle.answer(body)
        words = len(text.split()) + 1
        return JSONResponse({
            "id": "oracle", "object": "chat.completion", "created": int(time.time()), "model": "oracle",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": _logprobs(text, weighed) if body.get("logprobs") else None}],
            "usage": {"prompt_tokens": sum(len(m["content"]) for m in body["messages"]) // 4,
                      "completion_tokens": words, "total_tokens": 0}})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1", server


async def run(items: list[Item], detector: str, base: str, concurrency: int,
              realistic: bool = False) -> list[tuple[float, list, float, int, dict[str, float], int]]:
    """Per item: score, flagged spans, seconds, judge calls, the detector's features, tokens. A check that fails
    (the judge's faults outlasting its retries) scores as the proxy's fail-open would let it pass: 0."""
    retries = {"max_attempts": 3, "timeout_s": Realistic.TIMEOUT_S} if realistic else {"max_attempts": 1}
    config = Config.model_validate({
        "judge": {"model": "openai/oracle", "api_base": base, "api_key": "sk-oracle", **retries,
                  "cache": {"enabled": False}, "probe": "off"},
        "detector": {"name": detector.partition(":")[0]}})
    check = build_detector(config, name=detector)  # "metarag:paper": a profile
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> tuple[float, list, float, int, dict[str, float], int]:
        async with limit:
            started = time.perf_counter()
            try:
                found = await check.detect(RagInput(question=item.question, passages=item.passages), item.answer)
            except MorphguardError:
                if not realistic:
                    raise
                return 0.0, [], time.perf_counter() - started, 0, {"failed": 1.0}, 0
            spans = [(f.start, f.end, f.score) for f in found.factoids if f.start is not None and f.end is not None]
            return (found.score, spans, time.perf_counter() - started, found.cost.llm_calls, found.features,
                    found.cost.input_tokens + found.cost.output_tokens)

    return await asyncio.gather(*(one(i) for i in items))


def measure(items: list[Item], fit_items: list[Item], detector: str, p: float, delay: float,
            concurrency: int, realistic: bool = False, seed: int = 0) -> dict[str, Any]:
    """The detector on the report half `items` under the judge's errors drawn with `seed`, its threshold fitted on
    `fit_items` under another draw."""
    oracle = Oracle(items + fit_items, p, seed=seed, delay=delay, realistic=Realistic() if realistic else None)
    base, server = serve(oracle)
    try:
        report = asyncio.run(run(items, detector, base, concurrency, realistic))
        faults = dict(oracle.faults)
        oracle.seed = seed + 1  # the fit half's threshold is chosen under other noise
        fitted = asyncio.run(run(fit_items, detector, base, concurrency, realistic)) if fit_items else []
    finally:
        server.should_exit = True
    labels = [i.hallucinated for i in items]
    scores = [r[0] for r in report]
    chosen = metrics.best_threshold([i.hallucinated for i in fit_items], [r[0] for r in fitted]) if fitted \
        else THRESHOLD
    spanned = [(i, r) for i, r in zip(items, report, strict=True) if i.spans is not None]

    def span_f1(tau: float) -> float | None:
        return metrics.span_scores([[(s.start, s.end) for s in i.spans or []] for i, _ in spanned],
                                   [[(s, e) for s, e, score in r[1] if score >= tau] for _, r in spanned]).f1 \
            if spanned else None

    return {"n": len(items), "hallucinated": sum(labels), "auroc": metrics.auroc(labels, scores),
            "f1_at_0.3": metrics.at_threshold(labels, scores, THRESHOLD).f1,
            "recall_at_0.175": metrics.at_threshold(labels, scores, SENSITIVE).recall,
            "fit_threshold": chosen, "f1_at_fit": metrics.at_threshold(labels, scores, chosen).f1,
            "span_f1": span_f1(THRESHOLD), "span_f1_at_fit": span_f1(chosen),
            "calls_per_check": statistics.mean(r[3] for r in report),
            "p50_s": statistics.median(r[2] for r in report),
            "tokens_per_check": statistics.mean(r[5] for r in report),
            "failed_checks": sum(1 for r in report if r[4].get("failed")), "faults": faults,
            # the parts the sentences check's score is made of (whole, worst), for choosing how to weigh them
            "parts": {"report": [[i.hallucinated, r[4]] for i, r in zip(items, report, strict=True)],
                      "fit": [[i.hallucinated, r[4]] for i, r in zip(fit_items, fitted, strict=True)]}
            if any("whole" in r[4] for r in report) else None}


def plot(results: dict[str, Any], noise: list[float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [s for s in results if isinstance(results[s], dict)]
    fig, axes = plt.subplots(1, len(sets), figsize=(4 * len(sets), 3.4), sharey=True)
    for ax, name in zip([axes] if len(sets) == 1 else axes, sets, strict=True):
        for detector, rows in results[name].items():
            ax.plot(noise, [rows[str(p)]["auroc"] or 0 for p in noise], marker="o", label=detector)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("judge noise p")
        ax.grid(alpha=0.3)
    (axes if len(sets) == 1 else axes[0]).set_ylabel("AUROC (report half)")
    fig.legend(*(axes if len(sets) == 1 else axes[0]).get_legend_handles_labels(), loc="lower center", ncol=4,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out, dpi=110)


WEIGHTS = (0.0, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DRAWS = (1, 2, 3)  # seeds of the judge's errors over the fit halves for the shipped calibration (the report's: 0)


def fit_calibration(names: list[str], out: Path, concurrency: int, data_dir: Path | None) -> None:
    """The `sentences` check's shipped calibration: its readings of every fit half under the realistic judge, each
    half read under `DRAWS` draws of the judge's errors, fitted as `morphguard calibrate` fits a team's labels."""
    from morphguard.eval import calibrate

    parts, labels, sources, claims = [], [], [], []
    for name in names:
        fit_items = datasets.load_half(name, "fit", data_dir)
        oracle = Oracle(datasets.load_half(name, "report", data_dir) + fit_items, 0.0, seed=DRAWS[0], delay=0.0,
                        realistic=Realistic())
        base, server = serve(oracle)
        try:
            for seed in DRAWS:
                oracle.seed = seed
                for item, row in zip(fit_items, asyncio.run(run(fit_items, "sentences", base, concurrency, True)),
                                     strict=True):
                    if not row[4].get("failed"):
                        parts.append(row[4])
                        labels.append(item.hallucinated)
                        sources.append(name)
                        claims.append(([(s, e) for s, e, _ in row[1]],
                                       None if item.spans is None else [(s.start, s.end) for s in item.spans]))
        finally:
            server.should_exit = True
    found = calibrate.calibration(parts, labels, sources, "the scripted judge of benchmarks/judge_quality.py "
                                                          "(--judges realistic)", claims)
    fitted_on = {"datasets": names, "half": "fit", "draws": list(DRAWS), "answers": len(labels),
                 "hallucinated": sum(labels), "about_records": sum(p.get("record", 0.0) > 0 for p in parts),
                 "command": f"python benchmarks/judge_quality.py --fit-calibration {out} --datasets "
                            f"{','.join(names)}"}
    out.write_text(json.dumps({**found.model_dump(exclude_none=True), "fitted_on": fitted_on}, indent=2) + "\n")
    print(f"wrote {out}: {len(labels)} readings ({sum(labels)} hallucinated) of the fit halves of {', '.join(names)}")


def weigh(path: Path) -> None:
    """The `sentences` check's whole-answer weight: for each candidate, the AUROC of the fused score on every fit
    half and noise rate of a run's results, the chosen weight (the best mean), and its report-half AUROC."""
    results = json.loads(path.read_text())
    rows = [(name, p, row["parts"]) for name, by in results.items() if isinstance(by, dict) and "sentences" in by
            for p, row in by["sentences"].items() if row.get("parts")]

    def auroc(parts: list, weight: float) -> float:
        labels = [label for label, _ in parts]
        scores = [weight * f["whole"] + (1 - weight) * f["worst"] if "whole" in f else f.get("worst", 0.0)
                  for _, f in parts]
        return metrics.auroc(labels, scores) or 0.0

    print(f"{'weight':>6} " + " ".join(f"{n[:9]}@{p:<4}" for n, p, _ in rows) + "   mean (fit halves)")
    means = {}
    for weight in WEIGHTS:
        cells = [auroc(parts["fit"], weight) for _, _, parts in rows]
        means[weight] = statistics.mean(cells)
        print(f"{weight:>6} " + " ".join(f"{c:>14.3f}" for c in cells) + f"   {means[weight]:.4f}")
    best = max(WEIGHTS, key=lambda w: (means[w], -abs(w - 0.5)))
    print(f"chosen on the fit halves: {best}; report halves: "
          + ", ".join(f"{n}@{p} {auroc(parts['report'], best):.3f}" for n, p, parts in rows))


def _line(name: str, detector: str, label: str, n: int, cells: list[float | None]) -> str:
    """One printed row: the figures of `DRAWN`."""
    shown = [f"{c:>{w}.3f}" if c is not None else f"{'-':>{w}}" for c, w in zip(cells, (6, 6, 6, 6, 7, 7), strict=True)]
    return f"{name:<18} {detector:<10} {label:>4} {n:>4} " + " ".join(shown)


def main() -> None:
    import litellm

    litellm.suppress_debug_info = True  # the realistic judge's faults would print litellm's help banner each time
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weigh", type=Path, default=None,
                        help="a results file: choose the sentences check's whole-answer weight from its fit halves")
    parser.add_argument("--fit-calibration", type=Path, default=None,
                        help="write the sentences check's calibration fitted on the fit halves under the realistic "
                             "judge (the shipped one: morphguard/detectors/sentences.json)")
    parser.add_argument("--noise", default="0,0.1,0.2,0.3")
    parser.add_argument("--detectors", default=",".join(DETECTORS))
    parser.add_argument("--datasets", default=",".join(SETS))
    parser.add_argument("--limit", type=int, default=None, help="items per half (default: all)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to every judge call")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--judges", default="uniform",
                        help="comma-separated: uniform (the --noise rates) and/or realistic (the error model above)")
    parser.add_argument("--seeds", default="0",
                        help="comma-separated draws of the judge's errors; the first is the row's, and with more, "
                             "each row also holds every draw's figures and their mean and spread")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "judge_quality.json")
    args = parser.parse_args()
    if args.weigh:
        weigh(args.weigh)
        return
    if args.fit_calibration:
        fit_calibration(args.datasets.split(","), args.fit_calibration, args.concurrency, args.data_dir)
        return
    noise = [float(p) for p in args.noise.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, Any] = {"noise": noise, "delay_s": args.delay, "threshold": THRESHOLD}
    print(f"{'set':<18} {'detector':<10} {'p':>4} {'n':>4} {'AUROC':>6} {'F1@.3':>6} {'F1@fit':>6} {'R@.175':>6} "
          f"{'span@.3':>7} {'span@fit':>7} {'calls':>5} {'p50 s':>6}")
    for name in args.datasets.split(","):
        report = datasets.sample(datasets.load_half(name, "report", args.data_dir), args.limit)
        fit_items = datasets.sample(datasets.load_half(name, "fit", args.data_dir), args.limit)
        results[name] = {}
        for detector in args.detectors.split(","):
            rows = results[name][detector] = {}
            judges = args.judges.split(",")
            runs = [(str(p), p, False) for p in noise if "uniform" in judges]
            runs += [("realistic", 0.0, True)] if "realistic" in judges else []
            for key, p, realistic in runs:
                draws = [measure(report, fit_items, detector, p, args.delay, args.concurrency, realistic, seed)
                         for seed in seeds]
                row = rows[key] = draws[0]
                if len(draws) > 1:
                    row["draws"] = {"seeds": seeds, **{m: {"values": [d[m] for d in draws],
                                                           **metrics.spread(d[m] for d in draws)} for m in DRAWN}}
                print(_line(name, detector, key[:4], row["n"], [row[m] for m in DRAWN])
                      + f" {row['calls_per_check']:>5.1f} {row['p50_s']:>6.2f}", flush=True)
                for label in ("mean", "std") if len(draws) > 1 else ():
                    print(_line(name, detector, label, row["n"], [row["draws"][m][label] for m in DRAWN]), flush=True)
    args.out.write_text(json.dumps(results, separators=(",", ":")) + "\n")
    if "uniform" in args.judges.split(","):
        plot({k: v for k, v in results.items() if k in args.datasets.split(",")}, noise, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
