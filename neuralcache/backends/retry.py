"""Retry with exponential backoff and full jitter, for transient backend failures.

Used only inside backends: callers see the final domain error.  Defaults:
``ATTEMPTS`` 5 and ``BASE_DELAY_S`` 0.1 doubling to ``MAX_DELAY_S`` 2 give up after
about 3 s of backoff plus the attempts themselves, the same order as the AWS SDK's
"standard" retry mode (3 attempts, 20 s cap) but quicker to give up, since a training
reader would rather get EIO and retry itself than hang.
"""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")

ATTEMPTS = 5
BASE_DELAY_S = 0.1
MAX_DELAY_S = 2.0


class Transient(Exception):
    """Raised by an attempt to ask for another try; ``cause`` is the original error."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def with_retries(attempt: Callable[[], T], *, attempts: int = ATTEMPTS,
                 base_delay: float = BASE_DELAY_S, max_delay: float = MAX_DELAY_S,
                 deadline: float | None = None,
                 on_retry: Callable[[int, BaseException], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``attempt`` until it returns or raises something other than Transient.

    After the last attempt (or once ``deadline``, a time.monotonic() value, would be
    passed) the last Transient's ``cause`` is raised.
    """
    last: Transient | None = None
    for i in range(attempts):
        try:
            return attempt()
        except Transient as exc:
            last = exc
            if i == attempts - 1:
                break
            delay = random.uniform(0, min(max_delay, base_delay * (2 ** i)))
            if deadline is not None and time.monotonic() + delay >= deadline:
                break
            if on_retry:
                on_retry(i + 1, exc.cause)
            sleep(delay)
    assert last is not None
    raise last.cause
