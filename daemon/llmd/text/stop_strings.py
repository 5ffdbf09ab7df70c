"""Stop strings honoured across token boundaries.

Text that might be the beginning of a stop string is held back until it either completes the
stop (then it and everything after it is dropped) or cannot anymore (then it is released).
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Returns the text safe to emit; sets `stopped` when a stop string appeared."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if hits:
            first, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped = True
            self._held = ""
            return buf[:first]
        keep = self._longest_partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation, held text that never became a stop is released."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _longest_partial_suffix(self, buf: str) -> int:
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if s.startswith(buf[len(buf) - n :]):
                    best = n
                    break
        return best
