"""Rate-limited logging: one line per cause per interval, the next one saying how many were
dropped (as journald's ``RateLimitIntervalSec=``): :class:`RateLimitFilter` for handlers,
:class:`RateLimitedLog` for our own refusal sites with an explicit cause key.

More (why): docs/serving.md, "`infscaler/base/ratelog.py`".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

__all__ = ["RateLimitFilter", "RateLimitedLog", "install_rate_limit"]

_DIGITS = re.compile(r"\d+")
#: keys remembered at most (oldest forgotten first): a flood of distinct messages
#: cannot grow the filter
_MAX_KEYS = 1024


class _Window:
    """Per-key state: when the last line got through, how many were dropped since."""

    def __init__(self, interval_s: float, clock: Any) -> None:
        self.interval_s = float(interval_s)
        self._clock = clock
        self._seen: dict[Any, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def admit(self, key: Any) -> int | None:
        """None: drop this line; else let it through, with this many dropped before it."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval_s:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            dropped = 0 if last is None else last[1]
            self._seen.pop(key, None)
            self._seen[key] = (now, 0)
            if len(self._seen) > _MAX_KEYS:
                del self._seen[next(iter(self._seen))]
            return dropped


class RateLimitFilter(logging.Filter):
    """Let through one record per cause (logger, level, message with numbers masked) every
    ``interval_s`` seconds; records below ``min_level`` always pass. ``clock``: monotonic s.
    """

    def __init__(
        self, interval_s: float = 10.0, min_level: int = logging.INFO, clock: Any = time.monotonic
    ) -> None:
        super().__init__()
        self._window = _Window(interval_s, clock)
        self.min_level = min_level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: key on the template
            text = str(record.msg)
        dropped = self._window.admit((record.name, record.levelno, _DIGITS.sub("#", text)[:200]))
        if dropped is None:
            return False
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this in the last interval not logged]"
        return True


def install_rate_limit(interval_s: float = 10.0, logger: logging.Logger | None = None) -> None:
    """Add a :class:`RateLimitFilter` to every handler of ``logger`` (default: the root
    logger) that has none yet."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RateLimitFilter) for f in handler.filters):
            handler.addFilter(RateLimitFilter(interval_s))


class RateLimitedLog:
    """``logger`` with one line per ``key`` every ``interval_s`` seconds."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, clock: Any = time.monotonic
    ) -> None:
        self.logger = logger
        self._window = _Window(interval_s, clock)

    def log(self, level: int, msg: str, *args: Any, key: Any = None) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` (default: ``msg``) was logged
        within the interval. Returns whether it was."""
        dropped = self._window.admit(msg if key is None else key)
        if dropped is None:
            return False
        if dropped:
            msg = f"{msg} [{dropped} more in the last interval not logged]"
        self.logger.log(level, msg, *args)
        return True

    def warning(self, msg: str, *args: Any, key: Any = None) -> bool:
        return self.log(logging.WARNING, msg, *args, key=key)

    def info(self, msg: str, *args: Any, key: Any = None) -> bool:
        return self.log(logging.INFO, msg, *args, key=key)
