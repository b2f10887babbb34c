"""A verifier run in process: its ONNX export with ONNX Runtime, its own tokenizer with `tokenizers`.

The model's folder holds what `optimum-cli export onnx` (or `torch.onnx.export`) writes: the graph (`verifier.file`,
model.onnx), `tokenizer.json` and `config.json`, whose `id2label` names the labels. A hub id instead of a folder is
fetched with `huggingface_hub` where the hub can be reached. The graph takes `input_ids` and `attention_mask` (and
`token_type_ids` where it declares them) and gives logits: [batch, labels] for a claim classifier, [batch, tokens,
labels] for a token classifier; a claim classifier whose head labels tokens (HHEM's T5) is read at its first token.

Sequences are sorted by length and run `verifier.batch` at a time, padded to the longest of their batch, in a thread
of the verifier lane (`lanes.Lane`): off the event loop, in turn by client. ONNX Runtime computes each run with
`verifier.threads` threads of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from morphguard.config import VerifierSettings
from morphguard.errors import LLMError, MorphguardError
from morphguard.lanes import Lane
from morphguard.llm.client import reserve
from morphguard.llm.local import usable_cpus
from morphguard.llm.verifiers import Text, TokenScore, batches, label_index

PAD_TOKENS = ("[PAD]", "<pad>", "<|padding|>")
T = TypeVar("T")
_lane: Lane | None = None


def _model_lane() -> Lane:
    """One thread for model runs in the process: ONNX Runtime spreads each run over its own threads already."""
    global _lane
    if _lane is None:
        _lane = Lane(1)
    return _lane


def model_folder(settings: VerifierSettings) -> Path:
    """The folder of the model: `judge.model` where it is one, else the hub's copy of the repository it names."""
    model = settings.judge.model
    folder = Path(model).expanduser()
    if folder.is_dir():
        return folder
    if folder.is_absolute() or model.startswith((".", "~")) or model.count("/") != 1:
        raise MorphguardError(f"judge.model {model}: no such folder (nor a hub id, owner/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=[settings.file, "tokenizer.json",
                                                                      "config.json"]))
    except Exception as exc:  # no hub package, no network, no such repository: all mean no model
        raise MorphguardError(f"judge.model {model}: not a folder, and the hub could not give it "
                              f"({type(exc).__name__})") from None


class OnnxVerifier:
    def __init__(self, settings: VerifierSettings) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError:
            raise MorphguardError("the in-process verifier needs ONNX Runtime and tokenizers: "
                                  "pip install 'morphguard[verifier]'") from None
        self.settings = settings
        folder = model_folder(settings)
        self.name = settings.judge.model
        graph, vocabulary = folder / settings.file, folder / "tokenizer.json"
        for needed in (graph, vocabulary):
            if not needed.is_file():
                raise MorphguardError(f"judge.model {self.name}: {needed.name} is missing from {folder}")
        options = ort.SessionOptions()
        # every graph rewrite ONNX Runtime has (fused MatMul + scale, fused int8 MatMuls with the CPU's VNNI or AMX)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = settings.threads or usable_cpus()
        options.inter_op_num_threads = 1
        # Threads that sleep between runs rather than spin: the proxy's event loop and text threads share these CPUs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise MorphguardError(f"judge.model {self.name}: {graph.name} is not a model ONNX Runtime can "
                                  f"load ({str(exc)[:200]})") from None
        self.inputs = {i.name: (np.int32 if "int32" in i.type else np.int64) for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - set(self.inputs)
        if missing:
            raise MorphguardError(f"judge.model {self.name}: the graph has no input {sorted(missing)[0]}")
        # One tokenizer counts (no truncation, read from the text threads), one encodes for the model cutting the
        # context first, and one cuts the longest part where the second text alone is longer than a window.
        self.counter, self.tokenizer, self.fallback = (Tokenizer.from_file(str(vocabulary)) for _ in range(3))
        for made in (self.counter, self.tokenizer, self.fallback):
            made.no_padding()
        self.counter.no_truncation()
        self.tokenizer.enable_truncation(settings.max_tokens, strategy="only_first")
        self.fallback.enable_truncation(settings.max_tokens, strategy="longest_first")
        padding = self.tokenizer.padding
        self.pad_id = int(padding["pad_id"]) if padding else next(
            (i for i in map(self.tokenizer.token_to_id, PAD_TOKENS) if i is not None), 0)
        self.labels = _labels(folder, self.session.get_outputs()[0].shape[-1])
        self.label = label_index(settings.label, self.labels)

    def length(self, text: str) -> int:
        return len(self.counter.encode(text, add_special_tokens=False).ids)

    def calls(self, texts: Sequence[Text]) -> int:
        return batches(len(texts), self.settings.batch)

    async def supported(self, texts: Sequence[Text]) -> list[float]:
        reserve(self.calls(texts))
        return await self._run(self._supported, list(texts)) if texts else []

    async def hallucinated(self, texts: Sequence[tuple[str, str]]) -> list[list[TokenScore]]:
        reserve(self.calls(texts))
        return await self._run(self._hallucinated, list(texts)) if texts else []

    async def aclose(self) -> None:
        """Nothing to close: the session lives as long as the process."""

    async def _run(self, func: Callable[[list[Any]], T], texts: list[Any]) -> T:
        """`func(texts)` in the verifier lane; a failure of the model or its tokenizer is the check's error (the
        profile's `on_error` decides), never the request's."""
        try:
            return await _model_lane().run(func, texts)
        except MorphguardError:
            raise
        except Exception as exc:
            raise LLMError(f"verifier {self.name}: the model could not run ({type(exc).__name__}: "
                           f"{str(exc)[:200]})") from exc

    def _encode(self, texts: Sequence[Text]) -> list[Any]:
        inputs = [(a, b) if b is not None else a for a, b in texts]
        try:
            return list(self.tokenizer.encode_batch(inputs))
        except Exception:  # a second text longer than a window: the context cannot give way alone
            return list(self.fallback.encode_batch(inputs))

    def _supported(self, texts: list[Text]) -> list[float]:
        encodings = self._encode(texts)
        found: list[float] = [0.0] * len(texts)
        for chosen, logits in self._runs(encodings):
            if logits.ndim == 3:  # a head that labels tokens: the sequence's verdict is its first token's
                logits = logits[:, 0, :]
            for at, row in zip(chosen, _softmax(logits), strict=True):
                found[at] = float(row[self.label])
        return found

    def _hallucinated(self, texts: list[tuple[str, str]]) -> list[list[TokenScore]]:
        encodings = self._encode(texts)
        found: list[list[TokenScore]] = [[] for _ in texts]
        for chosen, logits in self._runs(encodings):
            if logits.ndim != 3:
                raise MorphguardError(f"judge.model {self.name}: a token classifier's logits are [batch, tokens, "
                                      f"labels], not {list(logits.shape)} (verifier.shape: claims?)")
            for at, rows in zip(chosen, _softmax(logits), strict=True):
                encoding = encodings[at]
                found[at] = [TokenScore(start, end, float(rows[k][self.label]))
                             for k, (sequence, (start, end)) in enumerate(zip(encoding.sequence_ids,
                                                                              encoding.offsets, strict=True))
                             if sequence == 1 and end > start]
        return found

    def _runs(self, encodings: list[Any]) -> list[tuple[list[int], Any]]:
        """The encodings run in batches of similar length: each batch's places among them and its logits."""
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        out = []
        for first in range(0, len(order), self.settings.batch):
            chosen = order[first:first + self.settings.batch]
            width = max(len(encodings[i].ids) for i in chosen)
            feed = {name: np.zeros((len(chosen), width), dtype=kind) for name, kind in self.inputs.items()}
            feed["input_ids"].fill(self.pad_id)
            for row, i in enumerate(chosen):
                encoding = encodings[i]
                size = len(encoding.ids)
                feed["input_ids"][row, :size] = encoding.ids
                feed["attention_mask"][row, :size] = 1
                if "token_type_ids" in feed:
                    feed["token_type_ids"][row, :size] = encoding.type_ids
            logits = self.session.run(None, {k: v for k, v in feed.items()
                                             if k in ("input_ids", "attention_mask", "token_type_ids")})[0]
            out.append((chosen, np.asarray(logits, dtype=np.float64)))
        return out


def _softmax(logits: Any) -> Any:
    """Label probabilities along the last axis; one logit is read as [1 - sigmoid, sigmoid]."""
    if logits.shape[-1] == 1:
        p = 1 / (1 + np.exp(-np.clip(logits, -500, 500)))
        return np.concatenate([1 - p, p], axis=-1)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _labels(folder: Path, width: Any) -> list[str]:
    """The label names of config.json's id2label, in index order; LABEL_i where it names none."""
    count = width if isinstance(width, int) else 0
    try:
        named = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("id2label") or {}
        named = {int(k): str(v) for k, v in named.items()}
    except (OSError, ValueError, AttributeError):
        named = {}
    count = max(count, len(named))
    labels = [named.get(i, f"LABEL_{i}") for i in range(count)]
    return labels if count > 1 else ["LABEL_0", "LABEL_1"]  # one logit: read as [1 - sigmoid, sigmoid]
