"""The one declaration of each detector, and everything read from it.

A detector module ends with `register(DetectorSpec(...))`: its name, its settings model (the config
section of the same name, declared in `config.DETECTOR_SECTIONS`), the prompts and models it uses, how
to build it. `stage_models`, `build_detector`, the proxy's per-request choice and the eval fingerprints
all read these specs. `detector.name: auto` is resolved by `resolve_auto`, one rule over the config.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from pydantic import BaseModel

from morphguard.config import AUTO_DETECTOR, DETECTOR_SECTIONS, Config
from morphguard.detectors.prompts import template
from morphguard.errors import MorphguardError
from morphguard.llm import LLMClient, build_client
from morphguard.llm.local import LOCAL_MODEL
from morphguard.models import Detection, RagInput

S = TypeVar("S", bound=BaseModel)

log = logging.getLogger(__name__)


class Detector(Protocol):
    name: str

    async def detect(self, rag: RagInput, answer: str) -> Detection: ...


def _whole(settings: BaseModel) -> dict[str, Any]:
    return {"options": settings.model_dump()}


def changed_options(settings: BaseModel) -> dict[str, Any]:
    """Fingerprint only the settings that differ from the defaults (so adding a setting keeps old results)."""
    defaults = type(settings)().model_dump()
    changed = {k: v for k, v in settings.model_dump().items() if defaults.get(k) != v}
    return {"options": changed} if changed else {}


@dataclass(frozen=True)
class DetectorSpec(Generic[S]):
    name: str
    settings: type[S]
    build: Callable[[S, float, LLMClient], Detector]  # from its settings, the threshold and the judge
    # Models the detector calls (None = the judge's default); empty: it needs no LLM at all.
    models: Callable[[S], list[str | None]] = lambda settings: [None]
    prompts: Callable[[S], Iterable[str]] = lambda settings: ()  # the templates that shape its output
    # What of the settings decides the output, for eval fingerprints (results under other settings are stale).
    fingerprint: Callable[[S], dict[str, Any]] = _whole
    profiles: Collection[str] = ()  # `name:PROFILE` sets the settings' `profile` field
    # The judge its fitted numbers were fitted with (`judge_identity`), None where it has none or they name none.
    fitted_judge: Callable[[S], dict[str, Any] | None] = lambda settings: None
    # Its settings joined with the judge's, for a detector whose judge is not reached through the LLM client.
    judged: Callable[[S, Config], S] = lambda settings, config: settings

    def settings_of(self, config: Config, profile: str = "") -> S:
        settings = self.judged(config.section(self.name, self.settings), config)
        return settings.model_copy(update={"profile": profile}) if profile else settings


SPECS: dict[str, DetectorSpec[Any]] = {}


def register(spec: DetectorSpec[S]) -> DetectorSpec[S]:
    if spec.name in SPECS:
        raise ValueError(f"detector {spec.name!r} is registered twice")
    if DETECTOR_SECTIONS.get(spec.name) is not spec.settings:
        raise ValueError(f"detector {spec.name!r}: its settings model must be config.DETECTOR_SECTIONS[{spec.name!r}]")
    SPECS[spec.name] = spec
    return spec


def is_known(name: object) -> bool:
    """Whether `name` names a registered detector, or one of its profiles as `name:PROFILE`."""
    if not isinstance(name, str):
        return False
    base, _, profile = name.partition(":")
    return base in SPECS and (not profile or profile in SPECS[base].profiles)


def judge_identity(config: Config, model: str | None = None) -> dict[str, Any]:
    """What tells one judge from another: its model and where it is served (the weights' hash, embedded)."""
    name = model or config.judge.model
    if name == LOCAL_MODEL:
        return {"model": name, "sha256": config.local.sha256}
    return {"model": name, "api_base": config.judge.api_base}


# `detector.name: auto` runs VERIFIER_CHOICE where one is configured, else FITTED_CHOICE where its weights were
# fitted with the configured judge, else OTHER_CHOICE.
FITTED_CHOICE = "combined"
OTHER_CHOICE = "sentences"
VERIFIER_CHOICE = "verifier"  # before both, where one is configured


def resolve_auto(config: Config) -> tuple[str, str]:
    """What `detector.name: auto` runs with this config, and why. `verifier` where the judge is a trained verifier
    (`judge.runtime`); else `combined` where its weights were fitted with the configured judge (the shipped ones:
    the embedded judge), else `sentences`, which leaves each sentence's call to the judge instead of to weights
    fitted around another one."""
    if config.judge.runtime != "llm":
        return VERIFIER_CHOICE, f"the judge is a trained verifier ({config.judge.model}, {config.judge.runtime})"
    spec = SPECS[FITTED_CHOICE]
    settings = spec.settings_of(config)
    judge = judge_identity(config, getattr(settings, "model", None))
    fitted = spec.fitted_judge(settings)
    if fitted == judge:
        return FITTED_CHOICE, f"its weights were fitted with this judge ({judge['model']})"
    return OTHER_CHOICE, (f"the {FITTED_CHOICE} check's weights were fitted with the judge {fitted}, not {judge}; "
                          f"{OTHER_CHOICE} leaves each sentence to the judge")


def configured(config: Config) -> str:
    """The detector the config runs: `detector.name`, with `auto` resolved (`resolve_auto`)."""
    name = config.detector.name
    return resolve_auto(config)[0] if name == AUTO_DETECTOR else name


def resolve(config: Config, name: str | None = None) -> tuple[DetectorSpec[Any], Any]:
    """The spec of `name` (default: the configured detector) and the settings it runs with."""
    name = configured(config) if not name or name == AUTO_DETECTOR else name
    base, _, profile = name.partition(":")
    if base not in SPECS:
        raise ValueError(f"unknown detector {base!r}; choose from {', '.join(sorted(SPECS))}")
    spec = SPECS[base]
    if profile and profile not in spec.profiles:
        known = f"profiles of {base}: {', '.join(sorted(spec.profiles))}" if spec.profiles else f"{base} has none"
        raise ValueError(f"unknown profile {name!r}; {known}")
    return spec, spec.settings_of(config, profile)


def stage_models(config: Config, name: str | None = None) -> list[str | None]:
    """Every model name the detector will call (None = the judge's default); empty when it calls none."""
    spec, settings = resolve(config, name)
    return spec.models(settings)


def build_detector(config: Config, llm: LLMClient | None = None, name: str | None = None) -> Detector:
    """The detector `name` (default: the configured one, `auto` resolved here and logged with its reason)."""
    if (name or config.detector.name) == AUTO_DETECTOR:
        name, why = resolve_auto(config)
        log.info("detector auto: %s, because %s (set detector.name to choose)", name, why)
    spec, settings = resolve(config, name)
    models = spec.models(settings)
    if models and config.judge.runtime != "llm":
        raise MorphguardError(f"the {spec.name} check asks a chat model, and the judge is a trained verifier "
                              f"(judge.runtime: {config.judge.runtime}): it runs the verifier check (detector.name: "
                              f"auto or verifier)")
    if llm is None and models:
        llm = build_client(config, models)
    # A detector that names no model never touches the client: it may be None there.
    detector = spec.build(settings, config.detector.threshold, cast(LLMClient, llm))
    if name and ":" in name:
        detector.name = name  # keep the profile in results: "metarag:paper"
    return detector


def fingerprint(config: Config, name: str) -> str:
    """A short hash of everything that decides a detector's score: judge, settings, prompts. Not the threshold:
    reports read stored scores at the threshold in force."""
    spec, settings = resolve(config, name)
    parts: dict[str, Any] = {"detector": spec.name}
    if spec.models(settings):
        parts["judge"] = [config.judge.model, config.judge.api_base]
        if config.judge.model == "local":
            parts["local"] = config.local.sha256
        parts["prompts"] = {n: template(n) for n in spec.prompts(settings)}
    parts.update(spec.fingerprint(settings))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
