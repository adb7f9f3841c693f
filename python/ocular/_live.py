"""Following a running recording: ``ocular.attach(pid)``, ``Recording.cursor()`` (RING.md 6)."""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterator

__all__ = ["Cursor", "Event", "Poll", "attach"]


class Event(tuple):
    """One event: ``thread_id``, ``ts_ns`` (since the recording started), ``kind`` (``"PY_START"``, ...),
    ``function`` (qualified name), ``filename``, ``line``, ``code`` (id), ``offset`` (bytes), ``arg``."""

    __slots__ = ()
    _fields = ("thread_id", "ts_ns", "kind", "function", "filename", "line", "code", "offset", "arg")

    thread_id = property(lambda self: self[0])
    ts_ns = property(lambda self: self[1])
    kind = property(lambda self: self[2])
    function = property(lambda self: self[3])
    filename = property(lambda self: self[4])
    line = property(lambda self: self[5])
    code = property(lambda self: self[6])
    offset = property(lambda self: self[7])
    arg = property(lambda self: self[8])

    def __repr__(self) -> str:
        return (f"Event(thread={self[0]}, ts_ns={self[1]}, {self[2]} {self[3]} "
                f"{os.path.basename(self[4]) if self[4] else '?'}:{self[5]})")


class Poll:
    """What one ``Cursor.poll()`` got: ``events`` (a list of ``Event``, empty when callbacks took them),
    ``missed`` (events the recording reused the memory of before they were read: counted exactly),
    ``ended`` (``None`` while the recording runs, ``"stopped"``, or ``"gone"`` if its process was killed)."""

    __slots__ = ("events", "missed", "ended", "count")

    def __init__(self, events: list, missed: int, ended: str | None, count: int) -> None:
        self.events, self.missed, self.ended, self.count = events, missed, ended, count

    def __repr__(self) -> str:
        return f"<ocular.Poll {self.count} events, {self.missed} missed, ended={self.ended}>"


class Cursor:
    """A reader of a running recording, in this process or another: ``poll()`` returns the events since
    the last poll. It takes no lock: the recording never waits for it; a cursor that polls too rarely
    misses events, and says exactly how many (``Poll.missed``). It starts when it is made (events already
    recorded are not delivered). Open one with ``ocular.attach(pid)`` or ``Recording.cursor()``."""

    def __init__(self, native: object) -> None:
        self._c = native
        self._code: dict = {}
        self.path: str = native.path
        self.pid: int = native.pid

    def _where(self, cid: int, offset: int) -> tuple:
        c = self._code.get(cid)
        if c is None:
            self._code = self._c.code()
            c = self._code.get(cid)
            if c is None:
                return ("?", "", 0)
        qual, filename, first, lines = c
        i = offset // 2
        return (qual, filename, lines[i] if 0 <= i < len(lines) and lines[i] > 0 else first)

    def poll(self, callbacks: dict[str, Callable[[Event], object]] | None = None) -> Poll:
        """The events since the last poll. With ``callbacks`` (``{"PY_START": f, ...}``, as eventring's
        API has them), each event of a kind named there is passed to its function instead of being
        returned, and events of other kinds are skipped."""
        raw, missed, ended = self._c.poll()
        events = []
        where = self._where
        for tid, ns, kind, cid, off, arg in raw:
            if callbacks is not None:
                f = callbacks.get(kind)
                if f is None:
                    continue
                f(Event((tid, ns, kind, *where(cid, off), cid, off, arg)))
            else:
                events.append(Event((tid, ns, kind, *where(cid, off), cid, off, arg)))
        return Poll(events, missed, ended, len(raw))

    def follow(self, interval: float = 0.01) -> Iterator[Poll]:
        """Polls every ``interval`` seconds until the recording ends, yielding each poll that got
        something (the last one, with ``ended`` set, always)."""
        while True:
            p = self.poll()
            if p.count or p.missed or p.ended:
                yield p
            if p.ended:
                return
            time.sleep(interval)

    def threads(self) -> dict[int, str]:
        """Thread names so far, by native id."""
        return self._c.threads()

    @property
    def totals(self) -> tuple[int, int]:
        """(events delivered, events missed) since the cursor was made."""
        return self._c.totals()

    def __repr__(self) -> str:
        d, m = self.totals
        return f"<ocular.Cursor pid={self.pid} delivered={d} missed={m}>"


def attach(target: int | str | os.PathLike[str]) -> Cursor:
    """A cursor on the running recording of process ``target`` (a pid), or on a ring file (a path). The
    recording is found in the user's runtime directory; another user's cannot be read (its directory and
    files are private to that user)."""
    from ._recorder import _native

    nat = _native()
    if isinstance(target, int):
        return Cursor(nat.attach(pid=target))
    return Cursor(nat.attach(path=os.fspath(target)))
