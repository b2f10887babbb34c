"""The one declaration of each detector, and everything read from it.

A detector module ends with `register(DetectorSpec(...))`: its name, its settings model (read from the
config section of the same name), the prompts and models it uses, how to build it. The config's
validation, `stage_models`, `build_detector`, the proxy's per-request choice and the eval fingerprints
all read these specs, so adding a detector is one new module in this package and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from pydantic import BaseModel

from morphguard.config import AUTO_DETECTOR, DETECTOR_SECTIONS, Config
from morphguard.detectors.prompts import template
from morphguard.llm import LLMClient, build_client
from morphguard.models import Detection, RagInput

S = TypeVar("S", bound=BaseModel)


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

    def settings_of(self, config: Config, profile: str = "") -> S:
        settings = config.section(self.name, self.settings)
        return settings.model_copy(update={"profile": profile}) if profile else settings


SPECS: dict[str, DetectorSpec[Any]] = {}


def register(spec: DetectorSpec[S]) -> DetectorSpec[S]:
    if spec.name in SPECS:
        raise ValueError(f"detector {spec.name!r} is registered twice")
    SPECS[spec.name] = spec
    DETECTOR_SECTIONS[spec.name] = spec.settings
    return spec


def is_known(name: object) -> bool:
    """Whether `name` names a registered detector, or one of its profiles as `name:PROFILE`."""
    if not isinstance(name, str):
        return False
    base, _, profile = name.partition(":")
    return base in SPECS and (not profile or profile in SPECS[base].profiles)


# What `detector.name: auto` runs, as `detectors.judges` chooses it (set when the package imports it).
_AUTO: list[Callable[[Config], str]] = []


def choose_auto_with(chooser: Callable[[Config], str]) -> None:
    _AUTO[:] = [chooser]


def configured(config: Config) -> str:
    """The detector the config runs: `detector.name`, with `auto` resolved for the configured judge."""
    name = config.detector.name
    return _AUTO[0](config) if name == AUTO_DETECTOR else name


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
    spec, settings = resolve(config, name)
    models = spec.models(settings)
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
