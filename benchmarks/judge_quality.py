"""How the check follows the judge's quality, without any API: scripted judges that answer the pipeline's real
prompts from the gold labels, with noise.

Each detector runs unchanged, over the real client (litellm, HTTP on loopback), against an oracle server. The
oracle reads each prompt the way a judge would be asked it, finds the answer sentence (or the whole answer) it
is about among the benchmark's items, and answers from the gold: a sentence is unsupported where it overlaps a
gold span, and the phrases it names are the gold spans' words within it; an answer is unsupported where the item
is labelled hallucinated. The noise model at rate p:
- each item has a difficulty d, uniform in [0, 1), shared by every question about it;
- each verdict is flipped with probability 2·p·d (so p on average; hard items are the ones judges get wrong);
- its stated confidence (the log-probabilities the client reads) is 1 at p = 0, else 0.55 + 0.45·(1 − d);
- a reply is malformed (not JSON, no verdict) with probability p/5, once per reply whatever it is about.
Where the oracle knows more than the prompt showed: it reads the gold whatever context it was sent, so a check
that sends a cut of the context (the spot check) is not punished for cutting away the evidence, and phrases it
names are exactly the annotators', which a real judge's would only approach.

Thresholds: F1 at the configured threshold (0.3), and at the threshold that maximises F1 on the fit half with
another noise seed. Span F1 (character overlap, as in RAGTruth) of the factoids at or above each threshold.

    python benchmarks/judge_quality.py [--noise 0,0.1,0.2,0.3] [--detectors sentences,direct,spotcheck,combined]
                                       [--datasets ragtruth-qa,...] [--limit N] [--delay 0.4]

Writes benchmarks/results/judge_quality.json and judge_quality.png. `--delay` adds that many seconds to every
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
from morphguard.eval import datasets, metrics
from morphguard.eval.items import Item
from morphguard.models import RagInput

HERE = Path(__file__).resolve().parent
SETS = ("ragtruth-qa", "ragtruth-summary", "ragtruth-data2txt", "contrast-qa")
DETECTORS = ("sentences", "direct", "spotcheck", "combined", "metarag:paper", "claims", "hierarchical")
THRESHOLD = 0.3


def _tag(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.S)
    return match.group(1).strip() if match else ""


class Oracle:
    """Answers each prompt from the gold labels of `items`, with noise at rate `p` (seeded)."""

    def __init__(self, items: list[Item], p: float, seed: int, delay: float) -> None:
        self.items, self.p, self.seed, self.delay = items, p, seed, delay
        self.calls = 0

    # --- finding what a prompt is about ---------------------------------------------------------------------

    def _item(self, text: str, prompt: str, others: tuple[str, ...] | list[str] = ()) -> tuple[Item, int] | None:
        """The item whose answer contains `text` (preferring one that also contains the prompt's `others`, then one
        whose question or context the prompt shows), and where. Six answers of one source can share a sentence."""
        found = [i for i in self.items if text and text in i.answer]
        if not found:
            return None
        exact = [i for i in found if i.answer.strip() == text]  # an edit that adds a sentence contains the original
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

    def _verdict(self, item: Item, unit: str, truth: bool) -> tuple[bool, float]:
        """The judge's verdict on "is it unsupported?" and its confidence in that verdict."""
        d = self._difficulty(item)
        flipped = random.Random(f"{self.seed}:flip:{item.id}:{unit}").random() < 2 * self.p * d
        confidence = 1.0 if self.p == 0 else 0.55 + 0.45 * (1 - d)
        return truth != flipped, confidence

    def _malformed(self, item: Item, unit: str) -> bool:
        return random.Random(f"{self.seed}:malformed:{item.id}:{unit}").random() < self.p / 5

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
            said, confidence = self._verdict(item, f"s{at}", truth)
            verdict = "UNSUPPORTED" if said else "SUPPORTED"
            entries.append({"id": number, "verdict": verdict, "phrases": phrases if said and truth else
                            ([sentence] if said else [])})
            weighed.append((verdict, "SUPPORTED" if said else "UNSUPPORTED", confidence))
        overall = "SUPPORTED"
        if whole is not None:  # the same question as `direct`'s, answered as the oracle answers that one
            if self._malformed(whole, "whole"):  # a reply is malformed or not as a whole, as `direct`'s is
                return "I could not check these sentences.", []
            said, confidence = self._verdict(whole, "whole", whole.hallucinated)
            overall = "UNSUPPORTED" if said else "SUPPORTED"
            weighed.append((overall, "SUPPORTED" if said else "UNSUPPORTED", confidence))
        return json.dumps({"sentences": entries, "answer": overall}), weighed

    def _direct(self, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        where = self._item(_tag(user, "answer"), user)
        if where is None:
            return json.dumps({"verdict": "YES", "unsupported": []}), [("YES", "NO", 0.5)]
        item, _ = where
        said, confidence = self._verdict(item, "whole", item.hallucinated)
        if self._malformed(item, "whole"):
            return "Unclear.", []
        # a wrong NO names something, as a wrong UNSUPPORTED sentence does: the answer's first sentence
        phrases = (self._gold(item, 0, len(item.answer)) if item.hallucinated else [item.answer.split(". ")[0]]) \
            if said else []
        verdict = "NO" if said else "YES"
        return json.dumps({"verdict": verdict, "unsupported": phrases[:8]}), [(verdict, "YES" if said else "NO",
                                                                                 confidence)]

    def _yes_no(self, sentence: str, user: str) -> tuple[str, list[tuple[str, str, float]]]:
        where = self._item(sentence, user)
        if where is None:
            return "YES", [("YES", "NO", 0.5)]
        item, at = where
        truth, _ = self._sentence_truth(item, at, at + len(sentence))
        said, confidence = self._verdict(item, f"s{at}", truth)
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
        said, confidence = self._verdict(item, unit, truth)
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
            said, confidence = self._verdict(item, f"s{s}", truth)
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
        said, confidence = self._verdict(item, f"s{at}", truth)
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
        text, weighed = oracle.answer(body)
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


async def run(items: list[Item], detector: str, base: str,
              concurrency: int) -> list[tuple[float, list, float, int, dict[str, float], int]]:
    """Per item: score, flagged spans, seconds, judge calls, the detector's features, tokens."""
    config = Config.model_validate({
        "judge": {"model": "openai/oracle", "api_base": base, "api_key": "sk-oracle", "max_attempts": 1,
                  "cache": {"enabled": False}, "probe": "off"},
        "detector": {"name": detector.partition(":")[0]}})
    check = build_detector(config, name=detector)  # "metarag:paper": a profile
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> tuple[float, list, float, int, dict[str, float], int]:
        async with limit:
            started = time.perf_counter()
            found = await check.detect(RagInput(question=item.question, passages=item.passages), item.answer)
            spans = [(f.start, f.end, f.score) for f in found.factoids if f.start is not None and f.end is not None]
            return (found.score, spans, time.perf_counter() - started, found.cost.llm_calls, found.features,
                    found.cost.input_tokens + found.cost.output_tokens)

    return await asyncio.gather(*(one(i) for i in items))


def measure(items: list[Item], fit_items: list[Item], detector: str, p: float, delay: float,
            concurrency: int) -> dict[str, Any]:
    oracle = Oracle(items + fit_items, p, seed=0, delay=delay)
    base, server = serve(oracle)
    try:
        report = asyncio.run(run(items, detector, base, concurrency))
        oracle.seed = 1  # the fit half's threshold is chosen under other noise
        fitted = asyncio.run(run(fit_items, detector, base, concurrency)) if fit_items else []
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
            "fit_threshold": chosen, "f1_at_fit": metrics.at_threshold(labels, scores, chosen).f1,
            "span_f1": span_f1(THRESHOLD), "span_f1_at_fit": span_f1(chosen),
            "calls_per_check": statistics.mean(r[3] for r in report),
            "p50_s": statistics.median(r[2] for r in report),
            "tokens_per_check": statistics.mean(r[5] for r in report),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weigh", type=Path, default=None,
                        help="a results file: choose the sentences check's whole-answer weight from its fit halves")
    parser.add_argument("--noise", default="0,0.1,0.2,0.3")
    parser.add_argument("--detectors", default=",".join(DETECTORS))
    parser.add_argument("--datasets", default=",".join(SETS))
    parser.add_argument("--limit", type=int, default=None, help="items per half (default: all)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to every judge call")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "judge_quality.json")
    args = parser.parse_args()
    if args.weigh:
        weigh(args.weigh)
        return
    noise = [float(p) for p in args.noise.split(",")]
    results: dict[str, Any] = {"noise": noise, "delay_s": args.delay, "threshold": THRESHOLD}
    print(f"{'set':<18} {'detector':<10} {'p':>4} {'n':>4} {'AUROC':>6} {'F1@.3':>6} {'F1@fit':>6} {'span@.3':>7} "
          f"{'span@fit':>7} {'calls':>5} {'p50 s':>6}")
    for name in args.datasets.split(","):
        report = datasets.sample(datasets.load_half(name, "report", args.data_dir), args.limit)
        fit_items = datasets.sample(datasets.load_half(name, "fit", args.data_dir), args.limit)
        results[name] = {}
        for detector in args.detectors.split(","):
            rows = results[name][detector] = {}
            for p in noise:
                row = rows[str(p)] = measure(report, fit_items, detector, p, args.delay, args.concurrency)
                cells = [row["auroc"], row["f1_at_0.3"], row["f1_at_fit"], row["span_f1"], row["span_f1_at_fit"]]
                print(f"{name:<18} {detector:<10} {p:>4} {row['n']:>4} "
                      + " ".join(f"{c:>6.3f}" if c is not None else f"{'-':>6}" for c in cells[:3]) + " "
                      + " ".join(f"{c:>7.3f}" if c is not None else f"{'-':>7}" for c in cells[3:])
                      + f" {row['calls_per_check']:>5.1f} {row['p50_s']:>6.2f}", flush=True)
    args.out.write_text(json.dumps(results, separators=(",", ":")) + "\n")
    plot({k: v for k, v in results.items() if k in args.datasets.split(",")}, noise, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
