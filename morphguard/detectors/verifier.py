"""Verifier: a trained hallucination detector decides, no LLM judge. The check a team runs on its own hardware.

Two shapes of model (`verifier.shape`), read through one interface however they run (`llm/verifiers.py`):

- **claims** (HHEM, MiniCheck, FactCG, an NLI cross-encoder): each answer sentence is a hypothesis, checked against
  the context sentences most relevant to it (`focus.Focus`, within `verifier.context_budget` characters), cut into
  windows the model takes (`verifier.max_tokens`, with the sentence and the special tokens): whole sentences in
  context order, as many as fit, a gap marked " … " and each passage on a line of its own. A sentence's score is 1
  minus the highest probability of supported over its windows, as MiniCheck takes the maximum over chunks; the
  window that gave it is the sentence's evidence (its runs of sentences, each where it is in its passage), named in
  its explanation.
- **tokens** (LettuceDetect): the context (focused on the answer within the budget) and the question make a prompt,
  and the model labels each answer token; the answer goes in parts of whole sentences of at most half the window,
  so that the context keeps room. Runs of tokens labelled hallucinated are the flagged spans; a sentence's score is
  its most hallucinated token's probability.

The answer's score is its worst sentence's. With `verifier.calibration` (a `morphguard calibrate` file), every
score is read through the logistic fitted on the team's labels for this model. A sentence scores no higher than
the answer, so a flagged sentence is always in a flagged answer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphguard.config import VerifierSettings
from morphguard.detectors.combined import Step
from morphguard.detectors.focus import Focus
from morphguard.detectors.registry import DetectorSpec, changed_options, register
from morphguard.detectors.sentences import calibrated
from morphguard.detectors.text import sentences
from morphguard.errors import MorphguardError
from morphguard.lanes import in_thread
from morphguard.llm.client import calls_left
from morphguard.llm.verifiers import Text, TokenScore, Verifier, batches
from morphguard.models import Cost, Detection, DetectionStats, Evidence, Factoid, RagInput, StageCost

VERSION = 1
log = logging.getLogger(__name__)
SPECIAL_TOKENS = 4  # room left in a window for the tokenizer's own tokens ([CLS] A [SEP] B [SEP] and the like)
# LettuceDetect's question-answering prompt, as its training data frames the context before the answer.
TOKENS_PROMPT = ("\nBriefly answer the following question:\n{question}\nBear in mind that your response should be "
                 "strictly based on the following {num_passages} passages:\n{context}\nIn case the passages do not "
                 "contain the necessary information to answer the question, please reply with: \"Unable to answer "
                 "based on given passages.\"\noutput:\n")
FLAGGED = 0.5  # a token more likely hallucinated than not is flagged (the argmax of two labels)


@dataclass(frozen=True)
class Window:
    """Context a claim is checked against: runs of consecutive sentences, each where it is in its passage."""

    parts: tuple[Evidence, ...]

    @property
    def text(self) -> str:
        """The runs as one premise: a gap within a passage marked " … ", passages apart on lines of their own."""
        out = ""
        for i, part in enumerate(self.parts):
            if i:
                same = self.parts[i - 1].passage == part.passage
                out += " … " if same else "\n"
            out += part.text
        return out

    def where(self) -> str:
        return "; ".join(f"passage {p.passage}, characters {p.start}-{p.end}" for p in self.parts)


@dataclass
class Scored:
    """One answer sentence: its place, raw score, the spans that flagged it and why."""

    start: int
    end: int
    score: float
    spans: list[tuple[int, int]]
    reason: str
    evidence: list[Evidence]


def identity(settings: VerifierSettings) -> dict[str, Any]:
    """What tells one verifier from another: its model (None where the judge is a chat model), how it runs and
    where."""
    judge = settings.judge
    return {"model": judge.model if judge.runtime != "llm" else None, "runtime": judge.runtime, "url": judge.api_base,
            "file": settings.file}


def build_verifier(settings: VerifierSettings) -> Verifier:
    """The configured model, loaded (in process) or addressed (served)."""
    if settings.judge.runtime == "llm":
        raise MorphguardError("the verifier check needs a trained verifier as the judge: judge.runtime (onnx, tei, "
                              "vllm-classify, vllm-score) and judge.model (a folder holding the ONNX export and its "
                              "tokenizer, a hub id, or the name a server serves the model under)")
    if settings.judge.runtime == "onnx":  # its imports (numpy, the optional ONNX Runtime) only where it runs
        from morphguard.llm.onnx_model import OnnxVerifier

        return OnnxVerifier(settings)
    from morphguard.llm.served import ServedVerifier

    return ServedVerifier(settings)


def load_calibration(path: str) -> dict[str, Any]:
    """A `morphguard calibrate` file for a verifier: its model and logistic."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        [float(v) for v in found["calibration"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MorphguardError(f"verifier.calibration {path}: not a calibration file ({exc})") from None
    return dict(found)


class VerifierCheck:
    name = "verifier"

    def __init__(self, model: Verifier, settings: VerifierSettings, threshold: float = 0.5) -> None:
        self.model = model
        self.settings = settings
        self.threshold = threshold
        self.logistic: tuple[float, float] | None = None
        if settings.calibration:
            found = load_calibration(settings.calibration)
            slope, intercept = found["calibration"]
            self.logistic = (float(slope), float(intercept))
            if found.get("judge") != identity(settings):
                log.warning("verifier.calibration %s was fitted for the model %s, not %s: rerun `morphguard "
                            "calibrate`", settings.calibration, found.get("judge"), identity(settings))

    async def detect(self, rag: RagInput, answer: str) -> Detection:
        started = time.perf_counter()
        size = rag.size(answer)
        if self.settings.shape == "claims":
            planned = await in_thread(self._windows, rag, answer, size=size)
            asked = [[self._text(window.text, answer[s:e]) for window in windows] for s, e, windows in planned]
            read = self._within_cap(asked)
            texts = [text for sentence in asked[:read] for text in sentence]
            supported = await self.model.supported(texts)
            scored, sequences = _claims(self.model.name, planned[:read], supported), len(texts)
            unchecked = planned[read][0] if read < len(planned) else None
        else:
            prompt, parts = await in_thread(self._prompt, rag, answer, size=size)
            read = self._within_cap([[(prompt, answer[s:e])] for s, e in parts])
            labelled = await self.model.hallucinated([(prompt, answer[s:e]) for s, e in parts[:read]])
            tokens = [TokenScore(s + t.start, s + t.end, t.probability)
                      for (s, _), found in zip(parts[:read], labelled, strict=True) for t in found]
            unchecked = parts[read][0] if read < len(parts) else None
            # the answer's sentences against its flagged tokens: grows with the answer, so off the event loop
            scored = await in_thread(_tokens, self.model.name, answer[:unchecked], tokens, size=size)
            sequences = read
        return self._detection(answer, scored, sequences, started, unchecked)

    def _within_cap(self, asked: list[list[Text]]) -> int:
        """How many of the answer's first parts (each its sequences) the check's judge-call budget leaves room for:
        all where it leaves room for all, else the most whose model runs or requests fit."""
        left = calls_left()
        if left is None or self.model.calls([t for part in asked for t in part]) <= left:
            return len(asked)
        low, high = 0, len(asked)  # the calls grow with the parts taken: the most that fit, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if self.model.calls([t for part in asked[:middle] for t in part]) <= left:
                low = middle
            else:
                high = middle - 1
        return low

    async def aclose(self) -> None:
        await self.model.aclose()

    def _text(self, premise: str, hypothesis: str) -> Text:
        template = self.settings.template
        return (template.format(premise=premise, hypothesis=hypothesis), None) if template else (premise, hypothesis)

    def _room(self, hypothesis: str) -> int:
        """The tokens of context a window beside `hypothesis` may hold."""
        framing = self.model.length(self.settings.template.format(premise="", hypothesis="")) \
            if self.settings.template else 0
        return max(16, self.settings.max_tokens - self.model.length(hypothesis) - framing - SPECIAL_TOKENS)

    def _windows(self, rag: RagInput, answer: str) -> list[tuple[int, int, list[Window]]]:
        """Each answer sentence with the windows of context it is checked against."""
        focus = Focus(rag.passages)
        lengths: dict[int, int] = {}
        planned = []
        for start, end in sentences(answer):
            hypothesis = answer[start:end]
            chosen = focus.chosen([hypothesis], self.settings.context_budget)
            if not chosen:  # no context sentence shares a word with it: the context's first sentences
                chosen = list(range(len(focus.pool)))
            for i in chosen:
                if i not in lengths:
                    lengths[i] = self.model.length(focus.pool[i].text)
            planned.append((start, end, _group(focus, chosen, lengths, self._room(hypothesis),
                                               self.settings.context_budget)))
        return planned

    def _prompt(self, rag: RagInput, answer: str) -> tuple[str, list[tuple[int, int]]]:
        """The prompt before the answer, and the answer's parts: whole sentences, at most half a window each."""
        bounds = sentences(answer)
        passages = self._focused(Focus(rag.passages), [answer[s:e] for s, e in bounds])
        context = "\n".join(f"passage {i}: {p}" for i, p in enumerate(passages, 1))
        prompt = (self.settings.template or TOKENS_PROMPT).format(
            context=context, question=rag.question, num_passages=len(passages))
        room = self.settings.max_tokens // 2
        parts: list[tuple[int, int]] = []
        used = 0
        for start, end in bounds:
            tokens = self.model.length(answer[start:end])
            if parts and used + tokens <= room:
                parts[-1] = (parts[-1][0], end)
                used += tokens
            else:
                parts.append((start, end))
                used = tokens
        return prompt, parts

    def _focused(self, focus: Focus, claims: list[str]) -> list[str]:
        """The context a token classifier reads: the sentences most relevant to the answer, within
        `verifier.context_budget` characters and `verifier.context_tokens` tokens of the model's tokenizer."""
        budget, limit = self.settings.context_budget, self.settings.context_tokens
        passages = focus.select(claims, budget)
        if limit is None:
            return passages
        tokens = self.model.length("\n".join(passages))
        while tokens > limit and budget > 1:  # characters in proportion to tokens, until the tokens fit
            budget = max(1, min(budget - 1, int(len("\n".join(passages)) * limit / tokens)))
            passages = focus.select(claims, budget)
            tokens = self.model.length("\n".join(passages))
        return passages

    def _detection(self, answer: str, scored: list[Scored], sequences: int, started: float,
                   unchecked: int | None) -> Detection:
        read = (lambda s: calibrated(s, self.logistic)) if self.logistic else (lambda s: s)
        deciding = max(scored, key=lambda s: s.score, default=None)
        worst = deciding.score if deciding else 0.0
        score = read(worst)
        explanation = []
        if deciding is not None:
            quoted = answer[deciding.start:deciding.end]
            quoted = quoted if len(quoted) <= 80 else quoted[:77] + "..."
            explanation.append(Step("verifier", 0.0, worst, f"the worst sentence, \"{quoted}\"; {deciding.reason}"))
        if self.logistic:
            explanation.append(Step("calibration", worst, score,
                                    f"the calibration {self.settings.calibration} fitted for {self.model.name}"))
        factoids = [f for s in scored for f in _factoids(answer, s, min(read(s.score), score), self.threshold)]
        calls = batches(sequences, self.settings.batch)
        seconds = time.perf_counter() - started
        stage = StageCost(llm_calls=calls, seconds=seconds)
        return Detection(
            detector=self.name, score=score, threshold=self.threshold, flagged=score >= self.threshold,
            factoids=factoids, cost=Cost.of({"verify": stage} if calls else {}, seconds),
            stats=DetectionStats(factoids=len(scored)),
            settings={"model": self.model.name, "shape": self.settings.shape, "runtime": self.settings.judge.runtime,
                      "sequences": sequences, "calls": calls,
                      "explanation": [step.record() for step in explanation]},
            features={"worst": worst}, unchecked_from=unchecked)


def _group(focus: Focus, chosen: list[int], lengths: dict[int, int], room: int, budget: int) -> list[Window]:
    """The chosen context sentences, in context order, as windows of at most `room` tokens, each sentence whole (one
    longer than a window is one alone: the tokenizer cuts its end). A window's parts are its runs of consecutive
    sentences of one passage. At most `budget` characters in all."""
    windows: list[Window] = []
    runs: list[list[int]] = []  # the open window's runs of consecutive sentences
    used = spent = 0

    def close() -> None:
        if runs:
            parts = []
            for run in runs:
                first, last = focus.pool[run[0]], focus.pool[run[-1]]
                parts.append(Evidence(passage=first.passage + 1, start=first.start, end=last.end,
                                      text=focus.passages[first.passage][first.start:last.end]))
            windows.append(Window(tuple(parts)))

    for i in chosen:
        sentence = focus.pool[i]
        spent += len(sentence.text)
        if spent > budget and windows:
            break
        if runs and used + lengths[i] > room:
            close()
            runs, used = [], 0
        previous = focus.pool[runs[-1][-1]] if runs else None
        if previous is not None and previous.passage == sentence.passage and previous.order + 1 == sentence.order:
            runs[-1].append(i)
        else:
            runs.append([i])
            used += 1  # the break between runs
        used += lengths[i]
    close()
    return windows


def _claims(model: str, planned: list[tuple[int, int, list[Window]]], supported: list[float]) -> list[Scored]:
    """Each sentence scored by the window that supports it most."""
    scored, at = [], 0
    for start, end, windows in planned:
        found = supported[at:at + len(windows)]
        at += len(windows)
        if not windows:
            scored.append(Scored(start, end, 1.0, [], f"{model}: the context has no sentence to check it against", []))
            continue
        best = max(range(len(windows)), key=lambda k: found[k])
        window = windows[best]
        reason = (f"{model}: supported with probability {found[best]:.2f} at most, in window {best + 1} of "
                  f"{len(windows)} ({window.where()})")
        scored.append(Scored(start, end, 1.0 - found[best], [], reason, list(window.parts)))
    return scored


def _tokens(model: str, answer: str, tokens: list[TokenScore]) -> list[Scored]:
    """Each sentence scored by its most hallucinated token; runs of flagged tokens as its spans."""
    scored = []
    for start, end in sentences(answer):
        inside = [t for t in tokens if start <= t.start and t.end <= end]
        spans: list[tuple[int, int]] = []
        for token in inside:
            if token.probability < FLAGGED:
                continue
            if spans and not answer[spans[-1][1]:token.start].strip():
                spans[-1] = (spans[-1][0], token.end)  # the next token of the run
            else:
                spans.append((token.start, token.end))
        worst = max((t.probability for t in inside), default=0.0)
        reason = (f"{model} labels {len(spans)} span(s) of the sentence hallucinated (token probability up to "
                  f"{worst:.2f})" if spans else f"{model} labels no token hallucinated (at most {worst:.2f})")
        scored.append(Scored(start, end, worst, spans, reason, []))
    return scored


def _factoids(answer: str, scored: Scored, score: float, threshold: float) -> list[Factoid]:
    """A flagged sentence as its flagged spans where the model names some, else the whole sentence."""
    flagged = score >= threshold
    label = "unsupported" if flagged else "supported"
    places = scored.spans if flagged and scored.spans else [(scored.start, scored.end)]
    return [Factoid(text=answer[s:e], start=s, end=e, score=score, label=label, reason=scored.reason,
                    evidence=scored.evidence) for s, e in places]


register(DetectorSpec(
    name="verifier", settings=VerifierSettings, models=lambda settings: [],
    fingerprint=lambda settings: {**changed_options(settings), "judge": identity(settings), "version": VERSION},
    judged=lambda settings, config: settings.judged_by(config.judge),
    build=lambda settings, threshold, llm: VerifierCheck(build_verifier(settings), settings, threshold)))
