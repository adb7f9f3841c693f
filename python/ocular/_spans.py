"""Spans: a stretch of the program its code marks as one unit of work (a request, a job), written into the
recording where it runs (FORMAT.md 5.9), so that ``ocular spans`` can say what ran inside each one.

    with ocular.span("GET /orders", user=42):
        handle(request)

    @ocular.span("nightly-report")
    async def report(): ...

While nothing records, a span costs a call and records nothing.
"""

from __future__ import annotations

import contextvars

# typing (and functools, for a decorated function) are imported only where needed: a followed child imports
# this module at its start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

_CO_COROUTINE = 0x80  # an `async def` function's code (inspect is not imported for it: 10 ms)

from . import _ocular

# The key of the span that encloses the code running now, per thread and per asyncio task (a task runs in
# a copy of the context it was created in). The extension reads and sets it.
_current: contextvars.ContextVar[int] = contextvars.ContextVar("ocular_span", default=0)


def _native() -> Any:
    return _ocular


def _kind(value: Any) -> int:
    """FORMAT.md 5.9's kind of an attribute value: 0 str, 1 bool, 2 int, 3 float, 4 a sequence, 5 other."""
    if isinstance(value, str):
        return 0
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 2
    if isinstance(value, float):
        return 3
    if isinstance(value, (list, tuple)):
        return 4
    return 5


def attributes(items: Any) -> list[tuple[str, int, str]]:
    """(key, kind, value as text) for each attribute of a mapping."""
    out = []
    for key, value in items.items():
        kind = _kind(value)
        out.append((str(key), kind, repr(value) if kind == 4 else str(value)))
    return out


# The span class is native: a service writes `with ocular.span(...)` around every request, and a Python
# class (or a subclass of the native one) took twice as long to make and enter.
span = _ocular.span


def decorate(s: span, fn: F) -> F:
    """``@ocular.span(name, **attributes)``: ``fn`` with a span per call, or, a coroutine function, per run
    of its coroutine."""
    import functools

    name, attrs = s.name, s.attributes or {}
    if getattr(getattr(fn, "__code__", None), "co_flags", 0) & _CO_COROUTINE:
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            # The span is the decorated coroutine's (this wrapper is Ocular's code, not recorded).
            coro = fn(*args, **kwargs)
            s = span(name, **attrs)._begin(coro)
            try:
                result = await coro
            except BaseException as e:
                s.__exit__(type(e), e, e.__traceback__)
                raise
            s.__exit__(None, None, None)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with span(name, **attrs):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def current() -> int:
    """The key of the span of the current recording that encloses the code running now (0: none)."""
    return _current.get()


class slower_than:
    """A flight recorder's dump rule (``record(ring="64MB", dump_when=ocular.slower_than("GET /orders",
    0.2))``): when a span of that name ends slower than ``seconds``, or, with ``percentile``, slower than
    that percentile of the name's last ``window`` spans (once there are ``minimum``), the recording writes
    its ring into a trace beside its file (``run.1.ocl``, ...), which holds the span whole if the ring was
    large enough to. At most one dump every ``every`` seconds per rule. As text (``ocular run --dump-when``):
    ``"GET /orders>0.2"``, ``"GET /orders>p99"``."""

    def __init__(self, name: str, seconds: float | None = None, *, percentile: float | None = None,
                 window: int = 1000, minimum: int = 100, every: float = 1.0) -> None:
        if (seconds is None) == (percentile is None):
            raise ValueError("slower_than takes seconds or percentile=, one of them")
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        if percentile is not None and not 0 < percentile < 100:
            raise ValueError(f"percentile must be between 0 and 100, not {percentile!r}")
        if window < 1 or not 1 <= minimum <= window:
            raise ValueError(f"window ({window}) must be >= 1 and minimum ({minimum}) between 1 and it")
        self.name, self.seconds, self.percentile = str(name), seconds, percentile
        self.window, self.minimum, self.every = window, minimum, every
        self._recent: list[float] = []  # sorted durations of the last `window` spans
        self._order: list[float] = []  # the same, in the order they ended
        self._last = float("-inf")

    @classmethod
    def parse(cls, text: str) -> slower_than:
        """``NAME>SECONDS`` or ``NAME>pP``."""
        name, sep, limit = str(text).rpartition(">")
        try:
            if not sep or not name:
                raise ValueError
            if limit.startswith("p"):
                return cls(name, percentile=float(limit[1:]))
            return cls(name, float(limit))
        except ValueError:
            raise ValueError(f"dump rule {text!r}: write NAME>SECONDS (\"GET /orders>0.2\") or NAME>pP "
                             f"(\"GET /orders>p99\")") from None

    def __str__(self) -> str:
        return f"{self.name}>{self.seconds:g}" if self.seconds is not None else f"{self.name}>p{self.percentile:g}"

    def __repr__(self) -> str:
        return f"ocular.slower_than({str(self)!r})"

    def __call__(self, name: str, seconds: float, now: float) -> bool:
        """Whether a span of ``name`` that took ``seconds`` and ended at ``now`` (perf_counter) dumps."""
        if name != self.name:
            return False
        if self.seconds is not None:
            slow = seconds > self.seconds
        else:
            import bisect

            recent = self._recent
            slow = False
            if len(recent) >= self.minimum:
                rank = min(len(recent) - 1, max(0, int(len(recent) * self.percentile / 100)))
                slow = seconds > recent[rank]
            bisect.insort(recent, seconds)
            self._order.append(seconds)
            if len(self._order) > self.window:
                del recent[bisect.bisect_left(recent, self._order.pop(0))]
        if slow and now - self._last >= self.every:
            self._last = now
            return True
        return False


def rules(dump_when: Any) -> list[slower_than]:
    """``record(dump_when=...)``'s rules: one, a text, or several of either."""
    if dump_when is None:
        return []
    if isinstance(dump_when, (str, slower_than)):
        dump_when = [dump_when]
    out = []
    for r in dump_when:
        if isinstance(r, slower_than):
            out.append(r)
        elif isinstance(r, str):
            out.append(slower_than.parse(r))
        else:
            raise TypeError(f"dump_when takes ocular.slower_than(...) rules or their text, not {r!r}")
    return out


# The running recording's dump rules, and the recording (set at its start, cleared at its stop, with
# set_rules).
_rules: list[slower_than] = []
_recording: Any = None


def set_rules(rules: list[slower_than], recording: Any) -> None:
    global _rules, _recording
    _rules, _recording = rules, recording
    _ocular.span_rules(bool(rules))


def ended(name: str, seconds: float) -> None:
    """A span ended: the flight recorder dumps if a rule says so."""
    import time

    now = time.perf_counter()
    rec = _recording
    for rule in _rules:
        if rule(name, seconds, now) and rec is not None:
            try:
                path = rec.dump()
            except Exception as e:  # noqa: BLE001 - a span's end must not raise into the program
                import sys

                print(f"ocular: span {name!r} took {seconds * 1e3:.1f} ms ({rule}): the dump failed: {e}",
                      file=sys.stderr)
                continue
            import sys

            print(f"ocular: span {name!r} took {seconds * 1e3:.1f} ms ({rule}): writing the flight recorder's "
                  f"ring into {path}", file=sys.stderr)


_ocular.span_setup(_current, ended, decorate)
