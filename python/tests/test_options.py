"""The recording's options are defined once, in the extension (`RecordOptions`, ocular-python's
src/cli.rs): `record()`'s keyword arguments, `ocular run`'s flags, `%%ocular`'s and the pytest plugin's
options, and what a followed child takes from its run all agree with that definition."""

from __future__ import annotations

import inspect
import subprocess
import sys

import ocular
from ocular import _follow, _options
from ocular._ipython import OptionError, parse_options


def test_record_takes_every_defined_option_with_its_default():
    params = inspect.signature(ocular.Recording.__init__).parameters
    keywords = {n: p.default for n, p in params.items() if n not in ("self", "path")}
    defaults = _options.defaults()
    assert set(keywords) == set(defaults)
    for name, default in defaults.items():
        # None stands for "none given" in Python where the command line has an empty list.
        assert keywords[name] == default or (keywords[name] is None and default == []), name
    # record()'s named parameters are Recording's first ones, with the same defaults.
    for name, p in inspect.signature(ocular.record).parameters.items():
        if p.kind is p.POSITIONAL_OR_KEYWORD and name != "path":
            assert p.default == keywords[name], name


def test_run_parses_each_flag_into_the_option_record_takes():
    parse = ocular._recorder._native().parse_run
    run = parse(["run", "--mode", "calls", "--threshold", "7", "--include", "a", "--include", "b",
                 "--sampled", "--window-period", "20", "--no-ring-file", "--no-follow", "--counters",
                 "page-faults,task-clock", "x.py", "--mode", "mine"])
    o = run["options"]
    assert set(o) == set(_options.defaults())
    assert (o["mode"], o["deinstrument_threshold"], o["include_only"], o["sampled"]) == ("calls", 7, ["a", "b"], True)
    assert (o["window_period"], o["ring_file"], o["follow"]) == (0.02, False, False)
    assert o["counters"] == ["page-faults", "task-clock"]
    assert run["argv"] == ["x.py", "--mode", "mine"]
    # Nothing given: the definition's defaults, following children as a run does.
    assert parse(["run", "x.py"])["options"] == {**_options.defaults(), "follow": True}


def test_run_help_lists_each_option_under_its_heading():
    out = subprocess.run([sys.executable, "-m", "ocular", "run", "--help"], capture_output=True, text=True).stdout
    recording, process = out.index("Recording:"), out.index("Process:")
    for spec in _options.specs():
        at = out.index(spec["flag"] + (" " if spec["value_name"] else ""))
        assert (recording < at < process) if spec["heading"] == "Recording" else at > process, spec["flag"]


def test_a_cell_takes_the_recording_options_and_refuses_the_process_ones():
    for spec in _options.specs():
        line = spec["flag"] + (" 1" if spec["value_name"] else "")
        if spec["heading"] == "Recording":
            ns, _ = parse_options(line.replace("--mode 1", "--mode calls"))
            assert hasattr(ns, spec["name"])
        else:
            try:
                parse_options(line)
            except OptionError as e:
                assert f"{spec['flag']} is not an option here" in str(e)
            else:
                raise AssertionError(f"{spec['flag']} taken by a cell")


def test_pytest_takes_the_recording_options_prefixed(tmp_path):
    from test_pytest_plugin import plugin_args

    out = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "--help"], capture_output=True, text=True,
                         cwd=tmp_path).stdout
    for spec in _options.recording():
        assert "--ocular-" + spec["flag"][2:] in out, spec["flag"]
    assert "--ocular-ring" not in out


def test_a_child_takes_every_option_of_its_run_but_following_and_the_dump_signal(tmp_path):
    rec = ocular.Recording(tmp_path / "run.ocl", "calls", 0, sampled=False, follow=True, c_calls=True)
    run = _follow.Run(rec)
    assert set(run.config["options"]) == set(_options.names()) - {"follow", "dump_on"}
    assert (run.config["options"]["mode"], run.config["options"]["c_calls"]) == ("calls", True)


def test_the_native_start_takes_one_typed_object_and_refuses_unknown_keys():
    import ast
    import os

    import pytest

    from ocular import _ocular, _recorder

    opts = _recorder._discard_options("calls", 0, 1024)
    with pytest.raises(ValueError, match='start: unknown option "thresold"'):
        _ocular.start(None, {}, {**opts, "thresold": 5})
    missing = dict(opts)
    del missing["max_buffers"]
    with pytest.raises(Exception, match="max_buffers"):
        _ocular.start(None, {}, missing)
    assert not _ocular.is_recording()
    # Every key the stub's _StartOptions declares is one the extension reads: all of them at once start a
    # recording (into nothing), which then stops.
    stub = ast.parse(open(os.path.join(os.path.dirname(_ocular.__file__), "_ocular.pyi")).read())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "_StartOptions")
    keys = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    optional = {"calibration": [], "on_full": "drop", "ring": False, "flight": 0, "live": False, "counters": [],
                "sampled": True}
    assert keys == set(opts) | set(optional)
    _ocular.start(None, {}, {**opts, **optional})
    try:
        assert _ocular.is_recording()
    finally:
        _ocular.stop({})
