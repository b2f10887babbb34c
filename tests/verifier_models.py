"""Tiny verifier models made in the test, with the inputs and outputs of real exports: a `tokenizers` tokenizer saved
as tokenizer.json, an ONNX graph built with `onnx.helper`, and a config.json naming the labels.

No trained weights can be had here, so the graphs compute a fixed rule from the token ids, which makes their output
something a test can predict:

- the claim classifier (inputs input_ids, attention_mask, token_type_ids, as BERT-like exports have; logits
  [batch, 2], label 1 "supported"): the hypothesis (type 1) is supported when each of its words occurs in the premise
  (type 0), the logits [2m - 1, 1 - 2m] for m words it lacks (P(supported) 0.88 for none, 0.12 for one);
- the token classifier (inputs input_ids, attention_mask, as ModernBERT exports have; logits [batch, tokens, 2],
  label 1 "hallucinated"): an answer token (after the first [SEP]) is hallucinated when its word is not in the prompt
  (before it), the logits [2 - 4h, 4h - 2] (P(hallucinated) 0.98 or 0.02).

What they cannot show: any model's accuracy. They prove the plumbing (loading, tokenising pairs, windows, batches,
padding, label mapping, offsets), not that a trained verifier finds hallucinations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
PAD, UNK, CLS, SEP = range(4)


def vocabulary(texts: Iterable[str]) -> dict[str, int]:
    """Every word of `texts` as the tokenizer splits it (lower case), after the special tokens."""
    split = pre_tokenizers.Whitespace()
    words = sorted({w for text in texts for w, _ in split.pre_tokenize_str(text.lower())})
    return {token: i for i, token in enumerate([*SPECIAL, *words])}


def tokenizer(vocab: dict[str, int]) -> Tokenizer:
    made = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    made.normalizer = normalizers.Lowercase()
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    made.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    return made


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _weights(size: int) -> np.ndarray:
    weights = np.ones(size, dtype=np.float32)
    weights[[PAD, CLS, SEP]] = 0  # the tokenizer's own tokens are never a claim's words
    return weights


def claims_graph(size: int) -> onnx.ModelProto:
    f = np.float32
    nodes = [
        _const("depth", np.array([size], dtype=np.int64)), _const("onoff", np.array([0, 1], dtype=f)),
        _const("axis1", np.array([1], dtype=np.int64)), _const("axis2", np.array([2], dtype=np.int64)),
        _const("zero", np.array(0, dtype=f)), _const("one", np.array(1, dtype=f)), _const("two", np.array(2, dtype=f)),
        _const("w", _weights(size)),
        helper.make_node("OneHot", ["input_ids", "depth", "onoff"], ["oh"], axis=-1),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["token_type_ids"], ["types"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mask", "types"], ["hyp"]),
        helper.make_node("Sub", ["mask", "hyp"], ["prem"]),
        helper.make_node("Unsqueeze", ["hyp", "axis2"], ["hyp3"]),
        helper.make_node("Unsqueeze", ["prem", "axis2"], ["prem3"]),
        helper.make_node("Mul", ["oh", "prem3"], ["ohp"]),
        helper.make_node("Mul", ["oh", "hyp3"], ["ohh"]),
        helper.make_node("ReduceSum", ["ohp", "axis1"], ["pbag"], keepdims=0),
        helper.make_node("ReduceSum", ["ohh", "axis1"], ["hbag"], keepdims=0),
        helper.make_node("Equal", ["pbag", "zero"], ["absent_b"]),
        helper.make_node("Cast", ["absent_b"], ["absent"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["hbag", "absent"], ["lacking"]),
        helper.make_node("Mul", ["lacking", "w"], ["lacking_w"]),
        helper.make_node("ReduceSum", ["lacking_w", "axis1"], ["missing"], keepdims=1),
        helper.make_node("Mul", ["missing", "two"], ["m2"]),
        helper.make_node("Sub", ["m2", "one"], ["l0"]),
        helper.make_node("Sub", ["one", "m2"], ["l1"]),
        helper.make_node("Concat", ["l0", "l1"], ["logits"], axis=1),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])]
    return _model(helper.make_graph(nodes, "tiny_claims", inputs, outputs))


def tokens_graph(size: int) -> onnx.ModelProto:
    f = np.float32
    nodes = [
        _const("depth", np.array([size], dtype=np.int64)), _const("onoff", np.array([0, 1], dtype=f)),
        _const("axis1", np.array([1], dtype=np.int64)), _const("axis2", np.array([2], dtype=np.int64)),
        _const("cumaxis", np.array(1, dtype=np.int64)), _const("sep", np.array(SEP, dtype=np.int64)),
        _const("zero", np.array(0, dtype=f)), _const("one", np.array(1, dtype=f)), _const("two", np.array(2, dtype=f)),
        _const("four", np.array(4, dtype=f)), _const("w", _weights(size).reshape(size, 1)),
        helper.make_node("OneHot", ["input_ids", "depth", "onoff"], ["oh"], axis=-1),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Equal", ["input_ids", "sep"], ["issep_b"]),
        helper.make_node("Cast", ["issep_b"], ["issep"], to=TensorProto.FLOAT),
        helper.make_node("CumSum", ["issep", "cumaxis"], ["seps"]),
        helper.make_node("Greater", ["seps", "zero"], ["after_b"]),
        helper.make_node("Cast", ["after_b"], ["after"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "issep"], ["notsep"]),
        helper.make_node("Mul", ["after", "notsep"], ["after_ns"]),
        helper.make_node("Mul", ["after_ns", "mask"], ["answer"]),
        helper.make_node("Sub", ["one", "after"], ["before"]),
        helper.make_node("Mul", ["before", "mask"], ["prompt"]),
        helper.make_node("Unsqueeze", ["prompt", "axis2"], ["prompt3"]),
        helper.make_node("Mul", ["oh", "prompt3"], ["ohp"]),
        helper.make_node("ReduceSum", ["ohp", "axis1"], ["pbag"], keepdims=0),
        helper.make_node("Greater", ["pbag", "zero"], ["present_b"]),
        helper.make_node("Cast", ["present_b"], ["present"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["present", "axis2"], ["present3"]),
        helper.make_node("MatMul", ["oh", "present3"], ["known"]),
        helper.make_node("MatMul", ["oh", "w"], ["weight"]),
        helper.make_node("Sub", ["one", "known"], ["unknown"]),
        helper.make_node("Unsqueeze", ["answer", "axis2"], ["answer3"]),
        helper.make_node("Mul", ["answer3", "weight"], ["aw"]),
        helper.make_node("Mul", ["aw", "unknown"], ["hall"]),
        helper.make_node("Mul", ["hall", "four"], ["h4"]),
        helper.make_node("Sub", ["two", "h4"], ["l0"]),
        helper.make_node("Sub", ["h4", "two"], ["l1"]),
        helper.make_node("Concat", ["l0", "l1"], ["logits"], axis=2),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", 2])]
    return _model(helper.make_graph(nodes, "tiny_tokens", inputs, outputs))


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(folder: Path, shape: str, texts: Iterable[str], labels: dict[int, str] | None = None) -> Path:
    """A model folder as an export leaves it (model.onnx, tokenizer.json, config.json) for `shape` (claims or tokens),
    knowing every word of `texts`."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary(texts)
    tokenizer(vocab).save(str(folder / "tokenizer.json"))
    graph = claims_graph(len(vocab)) if shape == "claims" else tokens_graph(len(vocab))
    onnx.save(graph, str(folder / "model.onnx"))
    labels = labels or ({0: "unsupported", 1: "supported"} if shape == "claims" else {0: "ok", 1: "hallucinated"})
    (folder / "config.json").write_text(json.dumps({"id2label": {str(k): v for k, v in labels.items()}}))
    return folder
