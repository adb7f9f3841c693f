"""Following the processes a recorded program starts (FORMAT.md 10).

The run's first process records into the path the user gave (``run.ocl``); every other Python process of
the run records into ``run.ocl.children/PID.ocl``. How each kind of child is reached:

- ``os.fork()`` (and multiprocessing's fork start method, fork-based process pools, the forkserver's
  workers): the child drops its parent's recording (never writing the parent's file) and starts its own,
  with the same options, from the fork hook, before the child's code goes on;
- a new interpreter (``subprocess`` or ``os.exec*`` of a Python, multiprocessing's spawn and forkserver
  start methods): the run puts ``ocular/_site`` first on ``PYTHONPATH`` and its settings in
  ``OCULAR_FOLLOW``; that directory's ``sitecustomize`` starts the child's recording when the interpreter
  starts, or writes ``PID.unrecorded.json`` saying why it cannot (an interpreter older than 3.12, another
  implementation, one without Ocular).

A child started with ``-E``, ``-I`` or ``-S`` ignores ``PYTHONPATH`` or ``site`` and runs unrecorded.
"""

from __future__ import annotations

import os
import sys

from . import _options

ENV = "OCULAR_FOLLOW"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# The recording options a child does not take from its run as they are: it follows its own children by
# being one, and a signal dumps each process's flight recorder through the run's own setting.
NOT_INHERITED = ("follow", "dump_on")


def dumps(value) -> str:
    """`value` (dicts with text keys, lists, text, numbers, booleans, None) as JSON, as ``json.dumps`` writes
    it, without importing json: json imports re and enum, which every followed child would pay at its start
    (about 5 ms) for one dictionary. The children read it with json's C scanner (``_site/sitecustomize.py``)."""
    out: list[str] = []

    def text(s: str) -> str:
        # As json writes it: printable ASCII without quotes or backslashes as it is (loading _json's
        # extension module for that took 0.4 ms of every run's start), anything else escaped by json.
        if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
            return '"' + s + '"'
        try:
            from _json import encode_basestring_ascii
        except ImportError:  # another implementation than CPython
            import json

            return json.dumps(s)
        return encode_basestring_ascii(s)

    def put(v) -> None:
        if v is None:
            out.append("null")
        elif v is True:
            out.append("true")
        elif v is False:
            out.append("false")
        elif isinstance(v, str):
            out.append(text(v))
        elif isinstance(v, int):
            out.append(int.__repr__(v))
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError(f"{v!r} has no JSON form")
            out.append(float.__repr__(v))
        elif isinstance(v, dict):
            out.append("{")
            for i, (k, item) in enumerate(v.items()):
                if not isinstance(k, str):
                    raise TypeError(f"JSON keys are text, not {k!r}")
                out.append(", " if i else "")
                out.append(text(k))
                out.append(": ")
                put(item)
            out.append("}")
        elif isinstance(v, (list, tuple)):
            out.append("[")
            for i, item in enumerate(v):
                out.append(", " if i else "")
                put(item)
            out.append("]")
        else:
            raise TypeError(f"{type(v).__name__} has no JSON form")

    put(value)
    return "".join(out)


def children_dir(path: str) -> str:
    """Where the children of the run recorded into `path` write."""
    return os.fspath(path) + ".children"


def child_path(directory: str, pid: int) -> str:
    """``PID.ocl`` in the run's directory, or ``PID.2.ocl``, ... when a process id is used again (os.exec*
    keeps it)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{pid}.ocl")
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(directory, f"{pid}.{n}.ocl")
    return path


def _text(s: str | bytes) -> str:
    """A command-line word as text for the file (FORMAT.md strings are UTF-8): undecodable bytes as U+FFFD."""
    return os.fsencode(s).decode("utf-8", "replace")


def process_info(run_id: int, parent_pid: int, started: str) -> dict:
    return {
        "run_id": run_id,
        "parent_pid": parent_pid,
        "started": started,
        "executable": _text(sys.executable or ""),
        "argv": [_text(a) for a in getattr(sys, "orig_argv", sys.argv)],
    }


class Run:
    """The run of a recording that follows its children: what the environment said before it, so that
    stopping the recording puts it back."""

    def __init__(self, rec) -> None:
        self.run_id = (int.from_bytes(os.urandom(8), "little") >> 1) or 1
        self.dir = os.path.abspath(children_dir(rec.path))
        self.config = {
            "dir": self.dir,
            "run_id": self.run_id,
            "package": PACKAGE_DIR,
            "options": {name: getattr(rec, name) for name in _options.names() if name not in NOT_INHERITED},
            "dump_on": rec.dump_on,
        }
        self._saved: dict[str, str | None] = {}
        # The flight recorder's size as given to Recording: None for none (Recording keeps 0).
        self.config["options"]["ring"] = rec.ring or None

    def begin(self) -> None:
        """Removes a previous run's directory (its files would mix with this one's; the first child makes
        it again) and tells new interpreters to follow."""
        if os.path.isdir(self.dir):
            import shutil  # only here: its import (bz2, lzma, fnmatch) is a few ms of every run's start

            shutil.rmtree(self.dir, ignore_errors=True)
        for key in (ENV, "PYTHONPATH"):
            self._saved[key] = os.environ.get(key)
        os.environ[ENV] = dumps(self.config)
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = SITE_DIR + (os.pathsep + path if path else "")

    def end(self) -> None:
        """Puts the environment back as it was (children started from now on are not followed)."""
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved.clear()


def start_child(config: dict, started: str = "exec", parent_pid: int | None = None):
    """Starts recording this process as a child of the run `config` describes (from ``OCULAR_FOLLOW``, or
    the parent's run after a fork)."""
    from ._recorder import Recording, take_handed_down_calibration

    take_handed_down_calibration(config.get("calibration"))
    rec = Recording(child_path(config["dir"], os.getpid()), **config["options"], dump_on=config.get("dump_on"))
    rec._follow_config = config
    # A child keeps SIGTERM's default action: with a handler in Python, a signal that came just before a
    # blocking call (a multiprocessing.Pool worker waiting for its next task) was never handled, and
    # Pool.terminate() hung. Killed, its trace is completed from its ring file (summary()).
    rec._handle_sigterm = False
    rec._process = process_info(config["run_id"], os.getppid() if parent_pid is None else parent_pid, started)
    rec.start()
    return rec


def unrecorded(config: dict, reason: str) -> None:
    """Says in the run's directory that this process runs unrecorded, and why."""
    note = {"pid": os.getpid(), "parent_pid": os.getppid(), "run_id": config.get("run_id"),
            "executable": sys.executable, "argv": [os.fsdecode(a) for a in getattr(sys, "orig_argv", sys.argv)],
            "python": "%d.%d.%d" % sys.version_info[:3], "implementation": sys.implementation.name, "reason": reason}
    try:
        os.makedirs(config["dir"], exist_ok=True)
        with open(os.path.join(config["dir"], f"{os.getpid()}.unrecorded.json"), "w") as f:
            f.write(dumps(note))
    except OSError:
        pass


def summary(path: str, run_id: int | None) -> tuple[int, int, list[str], int]:
    """(processes recorded, their events, notes on children that were not, children killed whose traces
    were completed from their ring files) of the run's children."""
    from ._recorder import _native

    directory = children_dir(path)
    if not os.path.isdir(directory):
        return 0, 0, [], 0
    processes = events = completed = 0
    notes = []
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if name.endswith(".unrecorded.json"):
            import json

            try:
                with open(full) as f:
                    note = json.load(f)
            except (OSError, ValueError):
                continue
            if note.get("run_id") == run_id:
                notes.append(f"pid {note.get('pid')} ({note.get('executable')}): {note.get('reason')}")
        elif name.endswith(".ocl"):
            try:
                # A child killed (Pool.terminate() kills its workers): its trace made whole from its ring
                # file now, while that is surely there.
                if _native().complete_trace(full) is not None:
                    completed += 1
            except OSError:
                pass
            try:
                n, rid = _native().file_events(full)
            except OSError:
                continue
            if rid == run_id:
                processes += 1
                events += n
    return processes, events, notes, completed
