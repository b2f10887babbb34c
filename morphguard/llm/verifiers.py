"""Trained verifiers: the one interface a check reads a hallucination detector through, however it runs.

Two shapes of model: a claim classifier scores texts (premise and hypothesis as a pair, or one text made of them by
a template) and says how likely each is supported; a token classifier reads a prompt (context and question) and an
answer, and says how likely each answer token is hallucinated. Two ways to run one (`judge.runtime`): in process
with ONNX Runtime (`llm/onnx_model.py`), or served by Text Embeddings Inference or vLLM (`llm/served.py`);
`detectors/verifier.py` builds the one configured.

Every model run or request counts as one judge call of the check's budget (`detector.max_judge_calls`), reserved
before the first is made. The check plans within what its budget leaves (`calls`): the answer's first sentences
that fit are checked and the rest left unchecked, as the `sentences` check does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from morphguard.errors import MorphguardError

Text = tuple[str, str | None]  # premise and hypothesis as a pair, or one text (the second None)


@dataclass(frozen=True)
class TokenScore:
    """One answer token: its characters in the answer and the probability it is hallucinated."""

    start: int
    end: int
    probability: float


class Verifier(Protocol):
    name: str  # the model, as explanations name it

    def length(self, text: str) -> int:
        """The tokens `text` takes (counted by the model's tokenizer in process, estimated for a server)."""
        ...

    def calls(self, texts: Sequence[Text]) -> int:
        """The model runs or requests (judge calls) `texts` take."""
        ...

    async def supported(self, texts: Sequence[Text]) -> list[float]:
        """For each text, the probability that the hypothesis is supported by the premise."""
        ...

    async def hallucinated(self, texts: Sequence[tuple[str, str]]) -> list[list[TokenScore]]:
        """For each (prompt, answer), every answer token with the probability that it is hallucinated."""
        ...

    async def aclose(self) -> None:
        """Let go of what it holds open (a served verifier's connections)."""
        ...


def label_index(label: str, labels: Sequence[str]) -> int:
    """Where `label` (a name of the model's id2label, in any case, or an index) is among its `labels`."""
    wanted = label.strip().lower()
    for i, name in enumerate(labels):
        if name.lower() == wanted:
            return i
    if wanted.isdigit() and int(wanted) < len(labels):
        return int(wanted)
    raise MorphguardError(f"verifier.label {label!r} is not a label of the model: {', '.join(labels)} "
                          f"(or an index below {len(labels)})")


def probabilities(logits: Sequence[float]) -> list[float]:
    """The labels' probabilities from a model's logits: a softmax, or for one logit [1 - sigmoid, sigmoid]."""
    if len(logits) == 1:
        p = 1 / (1 + math.exp(-max(-500.0, min(500.0, float(logits[0])))))
        return [1 - p, p]
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def batches(count: int, size: int) -> int:
    """How many runs or requests `count` sequences take, `size` at a time."""
    return -(-count // size)
