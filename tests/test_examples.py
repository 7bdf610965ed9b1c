"""Hand-checkable examples: digit weights make every output spell its window; and
every Python snippet of the README runs on its own and prints what the README shows."""
import pathlib
import re

import numpy as np
import pytest

import gdnconv
from gdnconv.testing import assert_bits_equal
from conftest import run_python

DIGITS = np.array([1.0, 10.0, 100.0, 1000.0], dtype=np.float32)  # weight[d] for W = 4


def _digit_call(rows, tokens, D):
    state = np.repeat(np.asarray(rows, dtype=np.float32)[None, :, None], D, axis=2)  # (1, L, D)
    x = np.repeat(np.asarray(tokens, dtype=np.float32)[None, :, None], D, axis=2)    # (1, T, D)
    weight = np.tile(DIGITS, (D, 1))
    return x, np.ascontiguousarray(state), weight


@pytest.mark.parametrize("D", [1, 5, 16, 37, 300])
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_spec_digits(isa, D, layout):
    """W=4, L=5, state rows 1..5, tokens 6 7 8, num_accepted=2: window [2 3 4 | 6 7 8]."""
    x, state, weight = _digit_call([1, 2, 3, 4, 5], [6, 7, 8], D)
    if layout == "DS":
        state = np.ascontiguousarray(state.transpose(0, 2, 1)).transpose(0, 2, 1)
    out = gdnconv.conv_update_multi(x, state, weight, None, activation=None,
                                    num_accepted_tokens=np.array([2], dtype=np.int32))
    expected_out = np.repeat(np.array([6432.0, 7643.0, 8764.0], np.float32)[None, :, None], D, axis=2)
    assert_bits_equal(out, expected_out, "out")
    expected_state = np.repeat(np.array([3, 4, 6, 7, 8], np.float32)[None, :, None], D, axis=2)
    assert_bits_equal(state, expected_state, "conv_state")


@pytest.mark.parametrize("D", [1, 5, 16, 37, 300])
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_plain_digits(isa, D, layout):
    """Plain mode, L=6, state rows 1..6, one token 7: window [1 2 3 | 7]; rows past W-1 untouched."""
    x, state, weight = _digit_call([1, 2, 3, 4, 5, 6], [7], D)
    if layout == "DS":
        state = np.ascontiguousarray(state.transpose(0, 2, 1)).transpose(0, 2, 1)
    out = gdnconv.conv_update_multi(x, state, weight, None, activation=None)
    assert_bits_equal(out, np.full((1, 1, D), 7321.0, np.float32), "out")
    expected_state = np.repeat(np.array([2, 3, 7, 4, 5, 6], np.float32)[None, :, None], D, axis=2)
    assert_bits_equal(state, expected_state, "conv_state")


def test_spec_example_from_spec(isa):
    """SPEC's worked example, W=4, k=3, L=6: state [a b | t d1 d2 d3], t and d1 accepted:
    window [b t d1], and after tokens y0..y3 the state is [t d1 | y0 y1 y2 y3]."""
    D = 24
    a, b, t, d1, d2, d3 = 1.0, 2.0, 3.0, 4.0, 5.0, 6.0
    ys = [7.0, 8.0, 9.0, 11.0]
    state = np.repeat(np.array([a, b, t, d1, d2, d3], np.float32)[None, :, None], D, axis=2)
    x = np.repeat(np.array(ys, np.float32)[None, :, None], D, axis=2)
    weight = np.tile(DIGITS, (D, 1))
    out = gdnconv.conv_update_multi(x, state, weight, activation=None,
                                    num_accepted_tokens=np.array([2], np.int32))
    window = [b, t, d1] + ys
    expected = [sum(DIGITS[k] * window[i + k] for k in range(4)) for i in range(4)]
    assert_bits_equal(out, np.repeat(np.array(expected, np.float32)[None, :, None], D, axis=2), "out")
    assert_bits_equal(state, np.repeat(np.array([t, d1] + ys, np.float32)[None, :, None], D, axis=2),
                      "conv_state")


def test_bias_and_silu_scalar_values(isa):
    """out = silu(bias + sum w*window) on values small enough to check by hand."""
    D = 20
    state = np.zeros((1, 3, D), np.float32)
    state[0, :, :] = np.array([1.0, -2.0, 0.5], np.float32)[:, None]
    x = np.full((1, 1, D), 2.0, np.float32)
    weight = np.tile(np.array([0.5, 0.25, -1.0, 1.0], np.float32), (D, 1))
    bias = np.full(D, -0.25, np.float32)
    out = gdnconv.conv_update_multi(x, state, weight, bias)
    y = -0.25 + 0.5 * 1.0 + 0.25 * -2.0 + -1.0 * 0.5 + 1.0 * 2.0   # = 1.25
    expected = y / (1.0 + np.exp(-y))
    np.testing.assert_allclose(out[0, 0].astype(np.float64), expected, rtol=1e-6)
    out = gdnconv.conv_update_multi(x, np.zeros((1, 3, D), np.float32), weight, bias, activation=None)
    np.testing.assert_array_equal(out[0, 0], np.float32(-0.25 + 2.0))


ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "clients.md"]   # user docs whose snippets must run
# a ```python block followed directly by the ```text block of what it prints
_SNIPPET = re.compile(r"```python\n(.*?)```\n```text\n(.*?)```", re.S)


def _doc_snippets():
    found = []
    for doc in DOCS:
        text = doc.read_text()
        snippets = _SNIPPET.findall(text)
        assert len(snippets) == text.count("```python"), f"every Python snippet of {doc.name} must be followed by its output"
        found += [pytest.param(c, p, id=f"{doc.stem}{i}") for i, (c, p) in enumerate(snippets)]
    return found


def test_readme_is_short_user_documentation():
    """The README stays what a new user reads in minutes (measurement history and design notes
    live in benchmarks/README.md and docs/design.md), and its test command is the one CI runs."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 230, "README.md: move details to docs/ or benchmarks/README.md"
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert '&& pip install ".[test]" && python -m pytest -q\n' in text
    assert '&& pip install ".[sim,torch]" && gdnconv simulate\n' in text


@pytest.mark.parametrize("code, printed", _doc_snippets())
def test_readme_snippet(code, printed):
    """Each README (and docs/clients.md) snippet runs in a fresh interpreter and prints
    exactly what the document shows."""
    if "import torch" in code:
        pytest.importorskip("torch")
    if "gdnconv.transformers" in code or "gdnconv.generate" in code:
        pytest.importorskip("transformers")
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout == printed, f"the document shows:\n{printed}\nthe snippet printed:\n{res.stdout}"
