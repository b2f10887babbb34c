"""How long a trained verifier takes to check a RAGTruth-sized answer on this machine's CPUs, beside the embedded
judge and the `sentences` check with a 400 ms API judge, in one run.

No trained weights can be downloaded here, and compute does not depend on them: the real architectures are built
from their configurations with random weights (transformers, no download) and exported to ONNX, each with a tokenizer
trained here on RAGTruth's own text (WordPiece, 30,000 words: about as many tokens per word as the real ones), then
run through the verifier check as a user runs them (`judge.runtime: onnx`, `threads` = the CPUs, `batch` 8):

- ModernBERT-base and -large as token classifiers, as LettuceDetect's base and large are (one window of up to 4,096
  tokens: context, question and answer);
- DeBERTa-v3-large as a claim classifier, as FactCG-DeBERTa and MiniCheck-DeBERTa are (each answer sentence against
  its windows of 512 tokens);
- T5-base's encoder with a token-classification head read at the first token, as HHEM-2.1-Open is (claims, 512);
- the two base-size ones again with their weights quantized to int8 (ONNX Runtime's `quantize_dynamic`), as a team
  would run them on a CPU (what quantizing costs in accuracy is not measured here).

The answer is the RAGTruth QA test item of median length (answer and context); `--checks` timed checks follow one
untimed. Per check: the wall time (median and 95th percentile) and the process's CPU time (all its threads; the
embedded judge's own server is another process, not counted). Beside them: `combined` (the shipped default) and
`sentences` with the embedded judge (llama.cpp), and `sentences` with a scripted OpenAI-compatible judge answering
each call after 400 ms (benchmarks/fixed_upstream.py) on loopback.

Building and exporting the models needs torch and transformers, which morphguard does not depend on: give a Python
that has them (`--export-python`, e.g. a venv made with `pip install torch==2.13.0 transformers onnx`, the CPU
build); the exported folders are kept in `--models` and reused. The timing runs in morphguard's own environment with
the `verifier` extra.

    python benchmarks/verifier_latency.py --export-python /work/venv-export/bin/python [--checks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "ragtruth" / "test_qa.jsonl"
# name: (the exported architecture, its folder (int8: quantized), verifier shape, window tokens, other settings)
MODELS = {
    "modernbert-base": ("modernbert-base", "modernbert-base", "tokens", 4096, {}),
    "modernbert-large": ("modernbert-large", "modernbert-large", "tokens", 4096, {}),
    "deberta-v3-large": ("deberta-v3-large", "deberta-v3-large", "claims", 512, {}),
    "t5-base": ("t5-base", "t5-base", "claims", 512, {}),
    # the base-size ones with their weights quantized to int8 (ONNX Runtime's dynamic quantization)
    "modernbert-base-int8": ("modernbert-base", "modernbert-base-int8", "tokens", 4096, {}),
    "t5-base-int8": ("t5-base", "t5-base-int8", "claims", 512, {}),
    # and reading at most 128 tokens of context, the sentences most relevant to the answer
    "modernbert-base-int8-context128": ("modernbert-base", "modernbert-base-int8", "tokens", 4096,
                                        {"context_tokens": 128}),
}


def item(path: Path) -> dict:
    """The QA item of median answer-and-context length, its context as passages."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda r: len(r["context"]) + len(r["answer"]))
    row = rows[len(rows) // 2]
    passages = [p.strip() for p in re.split(r"passage \d+:", row["context"]) if p.strip()]
    return {"question": row["question"], "passages": passages, "answer": row["answer"], "corpus": [
        r["context"] + "\n" + r["answer"] + "\n" + r["question"] for r in rows]}


# --- the export, run with --export-python (torch and transformers) -------------------------------------------------

def export(out: Path, names: set[str]) -> None:
    import torch
    from transformers import (
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
        ModernBertConfig,
        ModernBertForTokenClassification,
        T5Config,
        T5ForTokenClassification,
    )

    torch.manual_seed(0)
    built = {
        "modernbert-base": lambda: ModernBertForTokenClassification(ModernBertConfig(
            hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
            max_position_embeddings=8192, num_labels=2, attn_implementation="eager", reference_compile=False)),
        "modernbert-large": lambda: ModernBertForTokenClassification(ModernBertConfig(
            hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624,
            max_position_embeddings=8192, num_labels=2, attn_implementation="eager", reference_compile=False)),
        "deberta-v3-large": lambda: DebertaV2ForSequenceClassification(DebertaV2Config(
            vocab_size=128100, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
            max_position_embeddings=512, relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
            share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
            max_relative_positions=-1, num_labels=2)),
        "t5-base": lambda: T5ForTokenClassification(T5Config(
            vocab_size=32128, d_model=768, d_ff=2048, d_kv=64, num_layers=12, num_heads=12,
            feed_forward_proj="gated-gelu", num_labels=2)),
    }
    for name, make in built.items():
        folder = out / name
        if name not in names or (folder / "model.onnx").is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        model = make().eval()
        ids = torch.randint(5, 1000, (2, 64))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            torch.onnx.export(model, (ids, mask), str(folder / "model.onnx"),
                              input_names=["input_ids", "attention_mask"], output_names=["logits"],
                              opset_version=17, dynamo=False,
                              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                            "attention_mask": {0: "batch", 1: "sequence"},
                                            "logits": {0: "batch"} | ({1: "sequence"} if "Token" in type(model).__name__
                                                                      else {})})
        labels = {"0": "supported", "1": "hallucinated"} if name.startswith("modernbert") else {
            "0": "unsupported", "1": "supported"}
        (folder / "config.json").write_text(json.dumps({"id2label": labels, "architecture": type(model).__name__}))
        print(f"exported {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters) in "
              f"{time.perf_counter() - started:.0f} s", flush=True)


# --- the timing, in morphguard's environment -----------------------------------------------------------------------

def tokenizer(corpus: list[str]) -> Any:
    """A WordPiece tokenizer trained on RAGTruth's text, small enough (2,000 pieces) to cut it into as many tokens as
    the real tokenizers do or a few more: 4.1 characters a token on the timed item, where English runs about 4 to 4.5
    in BERT's, ModernBERT's and T5's vocabularies. The graphs' embeddings keep their real sizes."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    made = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    made.normalizer = normalizers.BertNormalizer(lowercase=True)
    made.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    made.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"], show_progress=False))
    cls, sep = made.token_to_id("[CLS]"), made.token_to_id("[SEP]")
    made.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return made


def quantized(source: Path, folder: Path) -> None:
    """`source`'s graph with its weights quantized to int8 (`quantize_dynamic`, as `optimum-cli onnxruntime
    quantize` does), once."""
    if (folder / "model.onnx").is_file():
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(str(source / "model.onnx"), str(folder / "model.onnx"), weight_type=QuantType.QInt8)
    (folder / "config.json").write_text((source / "config.json").read_text())


def timed(detector, question: str, passages: list[str], answer: str, checks: int) -> dict:
    """`checks` timed checks after one untimed: wall and CPU time, the load average over them, and for a model run
    in process the tokens it was fed (padded to each batch's longest, and the real ones)."""
    from morphguard.models import RagInput

    rag = RagInput(question=question, passages=passages)
    fed = {"padded": 0, "real": 0, "runs": 0}
    session = getattr(getattr(detector, "model", None), "session", None)
    if session is not None:
        run_model = session.run

        def counted(outputs, feed):
            fed["padded"] += int(feed["attention_mask"].size)
            fed["real"] += int(feed["attention_mask"].sum())
            fed["runs"] += 1
            return run_model(outputs, feed)

        detector.model.session = type("Counted", (), {"run": staticmethod(counted)})()

    async def run() -> dict:
        found = await detector.detect(rag, answer)  # untimed: first-run allocations, a server's warm-up
        fed.update(padded=0, real=0, runs=0)
        walls, cpus = [], []
        load = os.getloadavg()[0]
        for _ in range(checks):
            wall, cpu = time.perf_counter(), time.process_time()
            found = await detector.detect(rag, answer)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        walls.sort()
        row = {"median_ms": round(1000 * statistics.median(walls)), "p95_ms": round(1000 * walls[
            min(len(walls) - 1, int(0.95 * len(walls)))]), "cpu_ms": round(1000 * statistics.median(cpus)),
            "sequences_or_calls": found.settings.get("sequences", found.cost.llm_calls), "score": round(found.score, 3),
            "load_1m": [round(load, 1), round(os.getloadavg()[0], 1)]}
        if fed["runs"]:
            row["tokens_per_check"] = {k: v // checks for k, v in fed.items()}
        return row

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-python", default=None, help="a Python with torch and transformers, to export with")
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "morphguard-verifier-bench")
    parser.add_argument("--checks", type=int, default=10)
    parser.add_argument("--judge-latency-ms", type=float, default=400)
    parser.add_argument("--only", default=",".join([*MODELS, "sentences", "embedded-combined", "embedded-sentences"]),
                        help="comma-separated: the models, sentences, embedded-combined, embedded-sentences")
    parser.add_argument("--export-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_only:
        export(args.models, set(args.only.split(",")))
        return
    chosen = set(args.only.split(","))
    answer_item = item(DATA)
    needed = {MODELS[m][0] for m in chosen if m in MODELS}
    if args.export_python and any(not (args.models / m / "model.onnx").is_file() for m in needed):
        args.models.mkdir(parents=True, exist_ok=True)
        subprocess.run([args.export_python, __file__, "--export-only", "--models", str(args.models),
                        "--only", ",".join(sorted(needed))], check=True)
    vocabulary = tokenizer(answer_item["corpus"])
    for name, (source, folder, *_) in MODELS.items():
        if name in chosen and folder != source:
            quantized(args.models / source, args.models / folder)
        if (args.models / folder).is_dir():
            vocabulary.save(str(args.models / folder / "tokenizer.json"))

    sys.path.insert(0, str(HERE))
    from proxy_overhead import free_port, process

    from morphguard.config import Config
    from morphguard.detectors import build_detector

    cpus = len(os.sched_getaffinity(0))
    rows: dict[str, dict] = {}
    question, passages, answer = answer_item["question"], answer_item["passages"], answer_item["answer"]
    for name, (_, folder, shape, window, other) in MODELS.items():
        if name not in chosen:
            continue
        config = Config.model_validate({"judge": {"runtime": "onnx", "model": str(args.models / folder)},
                                        "verifier": {"shape": shape, "max_tokens": window, "threads": cpus, **other}})
        key = f"verifier {name} ({shape})"
        rows[key] = timed(build_detector(config, name="verifier"), question, passages, answer, args.checks)
        print(name, rows[key], flush=True)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        if "sentences" in chosen:
            port = free_port()
            base = f"http://127.0.0.1:{port}/v1"
            stack.enter_context(process([sys.executable, str(HERE / "fixed_upstream.py"), str(port),
                                         str(args.judge_latency_ms)], base + "/models", Path(tmp) / "judge.log"))
            config = Config.model_validate({"judge": {"model": "openai/bench", "api_base": base, "api_key": "sk-bench",
                                                      "cache": {"enabled": False}}})
            key = f"sentences, API judge at {args.judge_latency_ms:g} ms a call"
            rows[key] = timed(build_detector(config, name="sentences"), question, passages, answer, args.checks)
            print(key, rows[key], flush=True)
        for check in ("combined", "sentences"):  # the default with the embedded judge, and the check of every sentence
            if f"embedded-{check}" in chosen:
                key = f"{check}, embedded judge (Qwen2.5-Coder-1.5B Q4_K_M, llama.cpp)"
                rows[key] = timed(build_detector(Config(), name=check), question, passages, answer, args.checks)
                print(key, rows[key], flush=True)
    result = {"cpus": cpus, "checks": args.checks, "answer_chars": len(answer),
              "context_chars": sum(map(len, passages)), "rows": rows}
    out = HERE / "results" / "verifier_latency.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| check | median ms | p95 ms | CPU ms | sequences (calls) | tokens fed (real) | load 1 min |\n"
          "|---|---|---|---|---|---|---|")
    for key, row in rows.items():
        tokens = row.get("tokens_per_check")
        fed = f"{tokens['padded']} ({tokens['real']})" if tokens else "-"
        print(f"| {key} | {row['median_ms']} | {row['p95_ms']} | {row['cpu_ms']} | {row['sequences_or_calls']} | "
              f"{fed} | {row['load_1m'][0]}-{row['load_1m'][1]} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
