"""Plausibility bounds for the values a transcript holds ("absurd values" are refused on
load, not clamped), shared by the writer (:mod:`.schema`), the reader and the token columns."""

from __future__ import annotations

import re

_LOGPROB_EPS = 1e-3          # float16/32 log_softmax may round a certain token a hair above 0
_ENTROPY_EPS = 1e-3
_MAX_TIME = 1e11             # seconds since 1970: year ~5100
_MAX_TOKEN_ID = 2**31 - 1
_MAX_TOP = 100
_MAX_INDEX = 100_000_000
_MIN_LOGPROB = -1e9
_MAX_ENTROPY = 1e6
_HUGE = 1e300
_NUM = (int, float)
_MAX_REPLIES = 256
_MAX_COUNT = 2**40
_MAX_SECONDS = 1e7
_MAX_RATE = 1e9
_MAX_SHORT = 4096            # model name, dtype, backend, URL, hash...
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_FINISH = ("stop", "length", "cancelled", "error")


def _finite(x: float) -> bool:
    # Not math.isfinite: that raises OverflowError on an enormous int.
    return -_HUGE <= x <= _HUGE
