"""Stop strings, stop token ids and echo on one request's token stream (pure; no Ray).

The ingress applies these, not the engines: one place for every engine (the emulated
engine has no detokeniser state to stop on), and it survives a re-prefill on another
replica, where an engine-side matcher would restart from an empty text.

Contract of :class:`OutputFilter` (vLLM's semantics where they are defined):
- ``push`` takes each engine token in order and returns the text to send now, whether
  the request is finished and why. After a ``finished`` result the caller stops
  reading (and so aborts the request on its decode replica).
- A stop string ends the output at its first occurrence in the generated text (the
  earliest start among all stop strings; of two starting there, the shorter); the stop
  string itself and anything after it are dropped, unless
  ``include_stop_str_in_output``, which keeps text up to the end of the stop string.
  ``finish_reason`` is ``"stop"`` and :attr:`stop_reason` the stop string.
  Occurrences are found across token boundaries: a suffix of the text that could
  still become a stop string is held back until it cannot (or until the end).
- A token whose id is in ``stop_token_ids`` ends the output with ``"stop"``; its text
  is dropped unless ``include_stop_str_in_output``; :attr:`stop_reason` is the id.
- Any other end (``"length"``, an engine's EOS ``"stop"``) flushes what was held back.
- ``prefix`` (echo) is sent before the first generated text and never matched.
- The concatenated output is a function of the token sequence alone, whatever the
  chunking, so a streamed and a non-streamed request produce the same text.
"""

from __future__ import annotations

from collections.abc import Iterable

from br_serve.engine.sampling import held_suffix


class OutputFilter:
    """Applies stop strings, stop token ids and an echo prefix; see the module docstring.

    Raises:
        ValueError: an empty stop string.
    """

    __slots__ = ("_held", "_include", "_prefix", "_stop_ids", "_stops", "stop_reason")

    def __init__(self, stop: Iterable[str] = (), stop_token_ids: Iterable[int] = (),
                 include_stop_str_in_output: bool = False, prefix: str = "") -> None:
        self._stops = tuple(stop)
        if any(s == "" for s in self._stops):
            raise ValueError("stop: empty stop string")
        self._stop_ids = frozenset(stop_token_ids)
        self._include = include_stop_str_in_output
        self._prefix = prefix
        self._held = ""
        #: the stop string or token id that ended the output, else None
        self.stop_reason: str | int | None = None

    @property
    def active(self) -> bool:
        """Whether this filter can change anything (else the caller may skip it)."""
        return bool(self._stops or self._stop_ids or self._prefix)

    def _emit(self, text: str) -> str:
        out, self._prefix = self._prefix + text, ""
        return out

    def push(self, token_id: int, text: str, finished: bool,
             finish_reason: str | None) -> tuple[str, bool, str | None]:
        """One engine token in; ``(text to send, finished, finish_reason)`` out."""
        stop_id = token_id in self._stop_ids
        window = self._held + (text if self._include or not stop_id else "")
        hit = self._first_stop(window)
        if hit is not None:
            start, stop = hit
            self.stop_reason = stop
            cut = start + len(stop) if self._include else start
            self._held = ""
            return self._emit(window[:cut]), True, "stop"
        if stop_id:
            self.stop_reason = token_id
            self._held = ""
            return self._emit(window), True, "stop"
        if finished:
            self._held = ""
            return self._emit(window), True, finish_reason
        keep = held_suffix(window, self._stops)
        self._held = window[len(window) - keep:] if keep else ""
        return self._emit(window[:len(window) - keep]), False, None

    def _first_stop(self, window: str) -> tuple[int, str] | None:
        """``(position, stop string)`` of the earliest (then shortest) stop in ``window``.

        ``window`` starts with the held-back text, which is where any stop string that
        began in earlier tokens must start (everything before it was not a prefix of
        one), so searching the window alone finds every occurrence.
        """
        best: tuple[int, str] | None = None
        for s in self._stops:
            i = window.find(s)
            if i >= 0 and (best is None or (i, len(s)) < (best[0], len(best[1]))):
                best = (i, s)
        return best
