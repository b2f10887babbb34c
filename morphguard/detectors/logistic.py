"""The logistic function and its inverse, as the fitted scores here read them: `combined`'s channels and calibrations,
the `sentences` check's calibration, and `eval --fit` and `morphguard calibrate`, which fit them.

`log_odds` clips its probability first, so that a certain 0 or 1 has finite log-odds; how far (`clip`) is part of
what a calibration was fitted on, so the fit and the check that reads it pass the same clip.
"""

from __future__ import annotations

import math

CLIP = 1e-9  # `combined`'s: its noisy-OR can come within a billionth of 0 or 1 and still rank answers apart


def log_odds(p: float, clip: float = CLIP) -> float:
    p = min(max(p, clip), 1.0 - clip)
    return math.log(p / (1.0 - p))


def sigmoid(z: float) -> float:
    """The logistic of `z`, bounded at ±60 (a probability within 1e-26 of 0 or 1): `math.exp` stays in range."""
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))
