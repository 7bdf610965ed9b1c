"""The typing that ships with gdnconv (py.typed and the compiled module's _core.pyi):
mypy checks a small typed usage file against the installed (or PYTHONPATH) package,
reveals conv_update_multi's signature, and refuses bad arguments. The stub's parameters
match the compiled function's."""
import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest

import gdnconv

pytest.importorskip("mypy")

USAGE = textwrap.dedent("""\
    import numpy as np
    import gdnconv
    from gdnconv import conv_update_multi

    x = np.zeros((2, 1, 8), np.float32)
    state = np.zeros((2, 3, 8), np.float32)
    w = np.zeros((8, 4), np.float32)
    out = conv_update_multi(x, state, w, None, activation="silu",
                            num_accepted_tokens=np.ones(2, np.int32), out=None)
    reveal_type(conv_update_multi)
    reveal_type(out)
    isas: list[str] = gdnconv.available_isas()
    moved: int = gdnconv.bytes_moved(x, state, w)
    conv_update_multi(x, state, w, activation="relu")
    conv_update_multi(x, state, w, pad_slot_id="-1")
    """)
BAD_LINES = {14, 15}


def _package_root():
    """The folder holding the gdnconv under test (site-packages, or src/ in a checkout),
    as an absolute path: mypy runs in another folder."""
    return os.path.dirname(os.path.dirname(os.path.abspath(gdnconv.__file__)))


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mypy")
    (tmp / "usage.py").write_text(USAGE)
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp / "cache"),
                        "--python-executable", sys.executable, "--hide-error-context",
                        "--no-error-summary", "usage.py"],
                       cwd=tmp, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MYPYPATH="", PYTHONPATH=_package_root()))
    return r


def _lines(report, kind):
    return [(int(m.group(1)), m.group(2)) for m in
            re.finditer(rf"^usage\.py:(\d+): {kind}: (.*)$", report.stdout, re.M)]


def test_mypy_reveals_the_stub_signature(mypy_report):
    revealed = dict(_lines(mypy_report, "note"))
    sig = revealed[10]
    assert sig.startswith('Revealed type is "Overload(def [_A <: gdnconv._core._ArrayOrTensor] (x: _A, '), sig
    first = sig.split(", def ")[0]
    names = re.findall(r"(?:\(|, )(?:\*, )?(\w+): ", first)
    runtime = list(inspect.signature(gdnconv.conv_update_multi).parameters)
    assert names == runtime, (names, runtime)
    for part in ["*, activation: Literal['silu'] | Literal['swish'] | bool | None =",
                 "pad_slot_id: int =", "out: None =", "num_threads: int | None =, initial_state_indices: ",
                 "None =, is_weight_packed: bool =) -> _A"]:
        assert part in first, (part, first)
    assert "out: _A, num_threads" in sig  # a given out is returned as it is
    assert 'numpy.dtype[numpy.floating[numpy._typing._nbit_base._32Bit]]]"' in revealed[11], revealed[11]


def test_mypy_refuses_bad_arguments_only(mypy_report):
    errors = _lines(mypy_report, "error")
    assert {line for line, _ in errors} == BAD_LINES, mypy_report.stdout + mypy_report.stderr
    assert all("[call-overload]" in msg for _, msg in errors), errors
    assert mypy_report.returncode == 1


def test_stub_parameters_match_the_compiled_function():
    """Every overload in the stub has the compiled function's parameters, keyword-only split
    and defaults."""
    module = sys.modules[gdnconv.conv_update_multi.__module__]
    stub = os.path.splitext(os.path.splitext(module.__file__)[0])[0] + ".pyi"
    with open(stub) as f:
        tree = ast.parse(f.read())
    overloads = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "conv_update_multi"]
    assert len(overloads) == 3
    params = inspect.signature(gdnconv.conv_update_multi).parameters
    positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    kw_only = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for node in overloads:
        assert [a.arg for a in node.args.args] == positional
        assert [a.arg for a in node.args.kwonlyargs] == kw_only
        stub_defaults = [ast.literal_eval(d) for d in node.args.defaults]
        assert stub_defaults == [params[n].default for n in positional[-len(stub_defaults):]]
        for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
            if default is not None:   # out=None in the overload that returns a given out has none
                assert ast.literal_eval(default) == params[arg.arg].default, arg.arg
