"""Hallucination detectors. Each module that declares one registers it (`registry.register`) on import;
this package imports all of its modules, so a new detector is found by being here.

A name is a registered detector (`metarag`, `claims`, `direct`, …); `metarag:PROFILE` picks one of the
detector's profiles over the configured one, so an evaluation can set profiles side by side.
"""

from __future__ import annotations

import importlib
import pkgutil

from morphguard.detectors.registry import (
    SPECS,
    Detector,
    DetectorSpec,
    build_detector,
    configured,
    fingerprint,
    is_known,
    resolve,
    stage_models,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SPECS", "Detector", "DetectorSpec", "build_detector", "configured", "fingerprint", "is_known", "resolve",
           "stage_models"]
