"""Deprecated: the cache of detections is `morphguard.store.detections` (`DetectionCache`)."""

from __future__ import annotations

import warnings

from morphguard.store.detections import DetectionCache, key_of

warnings.warn("morphguard.store.verdicts is deprecated; use morphguard.store.detections (DetectionCache)",
              DeprecationWarning, stacklevel=2)

VerdictCache = DetectionCache

__all__ = ["DetectionCache", "VerdictCache", "key_of"]
