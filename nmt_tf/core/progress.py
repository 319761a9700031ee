"""The progress line the translating tools show on a terminal (translate, evaluate)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A progress line with ETA on stderr, only when stderr is a terminal."""

    def __init__(self, total: int | None):
        self.total, self.done, self.start = total, 0, time.time()
        self.enabled = sys.stderr.isatty()

    def update(self, n: int):
        self.done += n
        if not self.enabled:
            return
        elapsed = time.time() - self.start
        rate = self.done / max(elapsed, 1e-9)
        if self.total:
            eta = (self.total - self.done) / max(rate, 1e-9)
            sys.stderr.write(f"\r{self.done:,}/{self.total:,} lines ({100 * self.done / self.total:.0f}%), "
                             f"{rate:.1f} lines/s, ETA {eta:.0f}s   ")
        else:
            sys.stderr.write(f"\r{self.done:,} lines, {rate:.1f} lines/s   ")
        sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")
