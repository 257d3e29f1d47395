"""How long a failed job waits before its next attempt, and when it gives up."""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_BASE_SECONDS = 1.0
DEFAULT_CAP_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by `max_attempts`.

    After failed attempt number `attempt` (1-based) the job waits

        delay = random.uniform(0, min(cap_seconds, base_seconds * 2 ** (attempt - 1)))

    and, when the error carried a Retry-After hint, `max(delay, retry_after)` (the hint is
    a floor, also capped by `cap_seconds` so a hostile header cannot park a job forever).
    Attempt `max_attempts` is the last: its failure dead-letters the job. Permanent errors
    dead-letter at once whatever the count.

    Defaults: 8 attempts, base 1 s, cap 300 s (the last retry waits at most 128 s; the
    expected total wait before dead-lettering is about 2 minutes).
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base_seconds: float = DEFAULT_BASE_SECONDS
    cap_seconds: float = DEFAULT_CAP_SECONDS

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_seconds < 0 or self.cap_seconds < 0:
            raise ValueError("base_seconds and cap_seconds must be >= 0")

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the jittered delay after failed attempt `attempt`."""
        # min() before the power would overflow for huge attempt numbers.
        exponent = min(attempt - 1, 62)
        return min(self.cap_seconds, self.base_seconds * 2**exponent)

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after failed attempt `attempt` (see the class docstring)."""
        delay = (rng or random).uniform(0, self.ceiling(attempt))
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.cap_seconds))
        return delay

    def gives_up_after(self, attempt: int) -> bool:
        """True when attempt `attempt` was the last one."""
        return attempt >= self.max_attempts
