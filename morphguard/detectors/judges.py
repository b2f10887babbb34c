"""The judges a check calls (and a served verifier): whether each can be called,
asked once at start (`serve`, `worker`, `check`, `doctor`) rather than found out on every request, where a
refused call would pass the answer unchecked."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from morphguard.config import Config
from morphguard.detectors.registry import judge_identity, resolve, stage_models
from morphguard.errors import MorphguardError
from morphguard.llm import LLMClient
from morphguard.llm.local import LOCAL_MODEL
from morphguard.llm.providers import Abilities

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgeStatus:
    model: str  # as configured ("local", "openai/gpt-4.1-mini", ...)
    abilities: Abilities
    seconds: float
    error: str | None = None  # None: it answered both probe calls


async def probe_judges(config: Config, llm: LLMClient, name: str | None = None,
                       skip: frozenset[str] = frozenset()) -> list[JudgeStatus]:
    """Each distinct model the detector `name` (None: the configured one) calls, but those in `skip`, probed."""
    out = []
    for model in dict.fromkeys(m or config.judge.model for m in stage_models(config, name)):
        if model in skip:
            continue
        started = time.perf_counter()
        try:
            await llm.probe(model)
            error = None
        except Exception as exc:
            error = str(exc) or type(exc).__name__
        out.append(JudgeStatus(model, llm.abilities(model), time.perf_counter() - started, error))
    return out


async def require_judges(config: Config, llm: LLMClient | None, name: str | None = None) -> None:
    """As `judge.probe` says: refuse to start with a judge that cannot answer, or warn; and warn where the check's
    calibration was fitted with another judge."""
    _warn_of_calibration(config, name)
    if config.judge.probe == "off":
        return
    await _require_verifier(config, name)
    if llm is None:
        return
    # The embedded judge answered its health check when it started; a probe would also leave its prompt in llama.cpp's
    # cache, which moves the next check's log-probabilities in the third decimal.
    for status in await probe_judges(config, llm, name, skip=frozenset({LOCAL_MODEL})):
        if status.error is None:
            continue
        _unanswered(config, f"the judge {status.model} cannot be called: {status.error}")


def _unanswered(config: Config, message: str) -> None:
    """As `judge.probe` says of a judge that cannot answer: refuse to start (required), or warn and start."""
    if config.judge.probe == "required":
        raise MorphguardError(message + " (`morphguard doctor` shows each judge; judge.probe: warn starts "
                                        "anyway, and checks then fail as the profile's on_error says)")
    log.warning("%s; starting anyway (judge.probe: warn)", message)


@dataclass(frozen=True)
class VerifierStatus:
    model: str  # the folder, hub id or served name (judge.model)
    runtime: str  # onnx, tei, vllm-classify, vllm-score
    shape: str  # claims or tokens
    seconds: float  # loading it (in process) and one check of a statement against itself
    error: str | None = None  # None: it loaded and answered


PROBE_STATEMENT = "Water boils at 100 degrees Celsius at sea level."


async def probe_verifier(config: Config, name: str | None = None) -> VerifierStatus | None:
    """The trained verifier the check `name` (None: the configured one) reads, built (loaded, in process) and asked
    once about a statement against itself; None where the check reads none."""
    from morphguard.config import VerifierSettings
    from morphguard.detectors.verifier import build_verifier

    spec, settings = resolve(config, name)
    if spec.name != "verifier" or not isinstance(settings, VerifierSettings):
        return None
    started, error = time.perf_counter(), None
    try:
        verifier = build_verifier(settings)
        try:
            if settings.shape == "tokens":
                await verifier.hallucinated([(PROBE_STATEMENT, PROBE_STATEMENT)])
            else:
                template = settings.template
                await verifier.supported([(template.format(premise=PROBE_STATEMENT, hypothesis=PROBE_STATEMENT), None)
                                          if template else (PROBE_STATEMENT, PROBE_STATEMENT)])
        finally:
            await verifier.aclose()
    except Exception as exc:
        error = str(exc) or type(exc).__name__
    judge = settings.judge
    return VerifierStatus(judge.model, judge.runtime, settings.shape, time.perf_counter() - started, error)


async def _require_verifier(config: Config, name: str | None) -> None:
    """A served verifier asked once, as a judge is probed (one run in process was loaded when it was built)."""
    if config.judge.runtime in ("llm", "onnx"):
        return
    status = await probe_verifier(config, name)
    if status is None or status.error is None:
        return
    _unanswered(config, f"the verifier {status.model} at {config.judge.api_base} cannot be called: {status.error}")


def _warn_of_calibration(config: Config, name: str | None) -> None:
    from morphguard.detectors.sentences import Sentences, SentencesSettings, load_calibration

    spec, _ = resolve(config, name)
    settings = config.section(Sentences.name, SentencesSettings)
    if spec.name != Sentences.name or not settings.calibration:
        return
    fitted, judge = load_calibration(settings.calibration).judge, judge_identity(config, settings.model)
    if fitted != judge:
        log.warning("sentences.calibration %s was fitted with the judge %s, not %s: rerun `morphguard calibrate`",
                    settings.calibration, fitted, judge)
