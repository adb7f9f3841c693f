"""`specialize`: programs whose specialization is known by construction, recorded in a fresh interpreter,
and the report checked against that truth: a loop adding ints specializes (BINARY_OP_ADD_INT) and is not
listed; a loop adding an int and a Decimal on every iteration stays generic and is listed with the
mixed-types cause; a class with __getattr__ keeps LOAD_ATTR generic."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))

# `prev + x` is int + Decimal or Decimal + int on every iteration (xs alternates them), which no BINARY_OP
# form of 3.12-3.15 takes: generic whenever the specializer looks. (Not int + float: 3.14's
# BINARY_OP_EXTEND takes that. And not `s = s + x` alone: it would flip between a specialized form and
# generic as the guard misses, and the snapshot shows either.)
PROGRAM = textwrap.dedent("""
    import sys
    from decimal import Decimal
    import ocular

    def int_loop(n):
        s = 0
        for i in range(n):
            s = s + i
        return s

    def mixed_loop(xs):
        s = 0.0
        prev = xs[-1]
        for x in xs:
            s += float(prev + x)
            prev = x
        return s

    class Dyn:
        def __getattr__(self, name):
            return 1

    def getattr_loop(n):
        d = Dyn()
        t = 0
        for _ in range(n):
            t += d.foo
        return t

    xs = [1, Decimal(1)] * 20000
    with ocular.record(sys.argv[1], mode="adaptive", deinstrument_threshold=int(sys.argv[2])):
        int_loop(40000)
        mixed_loop(xs)
        getattr_loop(20000)
""")


def _record(tmp_path, threshold):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    out = tmp_path / "run.ocl"
    r = subprocess.run([sys.executable, str(prog), str(out), str(threshold)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def _report(path, *args):
    r = subprocess.run([ANALYZE, "specialize", "--json", *args, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _loop(report, function):
    (block,) = [b for b in report["blocks"] if b["kind"] == "loop" and b["function"] == function]
    return block


@pytest.mark.parametrize("threshold", [0, 500])
def test_generic_instructions_are_the_ones_built_to_be(tmp_path, threshold):
    # GIVEN a recording of the three loops
    report = _report(_record(tmp_path, threshold))
    assert report["python"] == sys.version.split()[0]
    assert report["mode"] == "adaptive"

    # THEN the int loop's BINARY_OP specialized and nothing in it is listed
    ints = _loop(report, "int_loop")
    assert ints["generic"] == []
    assert ints["specialized"] >= 1

    # the mixed loop's `prev + x` is listed, generic at stop, with the mixed-types cause, and its `s += ...`
    # (float += float) and its float() call are not
    mixed = _loop(report, "mixed_loop")
    (g,) = mixed["generic"]
    assert (g["base"], g["operator"], g["at_stop"], g["status"]) == ("BINARY_OP", "+", "BINARY_OP", "generic at stop")
    assert "Decimal" in g["cause"]
    assert "BINARY_OP_ADD_FLOAT" in g["forms"] and "BINARY_OP_ADD_INT" in g["forms"]
    assert g["line"] == PROGRAM.splitlines().index("        s += float(prev + x)") + 1
    assert g["executions"] >= 2
    assert 0 < g["weight_ns"] <= mixed["total_ns"]
    assert 0 < g["share"] <= 1

    # the __getattr__ loop's LOAD_ATTR is listed with its cause
    dyn = _loop(report, "getattr_loop")
    assert [x["base"] for x in dyn["generic"]] == ["LOAD_ATTR"]
    assert "__getattr__" in dyn["generic"][0]["cause"]

    # and the functions holding those loops do not list them twice
    funcs = [b for b in report["blocks"] if b["kind"] == "function" and b["function"] in ("mixed_loop", "getattr_loop")]
    assert funcs and all(b["listed_elsewhere"] >= 1 for b in funcs)
    assert all(x["offset"] != g["offset"] for b in funcs for x in b["generic"])


def test_text_report_and_python_m_ocular(tmp_path):
    path = _record(tmp_path, 500)
    text = subprocess.run([ANALYZE, "specialize", "--top", "3", str(path)], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"Specialization at stop: {path} (Python {sys.version.split()[0]}, adaptive mode)")
    lines = text.stdout.splitlines()
    (hit,) = [i for i, line in enumerate(lines) if "BINARY_OP (+) -> BINARY_OP (generic at stop)" in line]
    assert lines[hit].lstrip().startswith("mixed_loop  prog.py:")
    assert lines[hit + 1].lstrip().startswith("likely cause: operand types vary")
    assert any("LOAD_ATTR -> LOAD_ATTR (generic at stop)" in line for line in lines)

    # The same command through the analyzer compiled into the extension.
    py = subprocess.run([sys.executable, "-m", "ocular", "specialize", "--top", "3", str(path)],
                        capture_output=True, text=True)
    assert py.returncode == 0, py.stderr
    assert py.stdout == text.stdout


def test_help_teaches_with_an_example():
    r = subprocess.run([ANALYZE, "specialize", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "ocular-analyze specialize run.ocl --top 3" in r.stdout
    assert "generic" in r.stdout and "Weights are estimates" in r.stdout
