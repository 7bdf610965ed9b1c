"""torch.compile(fullgraph=True) of functions that call the plain gdnconv.conv_update_multi /
conv_prefill on tensors: they trace as the gdnconv:: ops, whatever the import order, give the
eager call's bits, and the eager call stays the C function it was."""
import inspect
import types

import numpy as np
import pytest

import gdnconv
from conftest import run_python

torch = pytest.importorskip("torch")


def _graph_targets():
    """A torch.compile backend that records the targets of the graph's calls, then runs it eagerly."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    return backend, seen


def _compiled_equals_eager(serve, args, eager_args, state):
    """serve compiled (fullgraph) on args against serve eager on eager_args (copies): the graph
    calls both gdnconv:: ops, and the outputs and args[state] (the conv state) equal bit for bit."""
    backend, seen = _graph_targets()
    got = torch.compile(serve, fullgraph=True, backend=backend)(*args)
    want = serve(*eager_args)
    assert any("gdnconv.conv_prefill" in t for t in seen) and any("gdnconv.conv_update_multi" in t for t in seen), seen
    for a, b in zip(got, want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.equal(args[state].contiguous().view(torch.int16),
                       eager_args[state].contiguous().view(torch.int16)), "conv_state"


def test_plain_calls_trace_as_the_ops_with_the_eager_bits():
    """Prefill, a speculative step with out= and a plain step, one graph: the graph calls the
    gdnconv:: ops (no graph break: fullgraph), and outputs and states equal the eager calls' bits."""
    def serve(prompt, draft, token, state, weight, bias, out):
        y = gdnconv.conv_prefill(prompt, weight, bias, conv_state=state)
        gdnconv.conv_update_multi(draft, state, weight, bias, activation=None,
                                  num_accepted_tokens=torch.tensor([1, 2], dtype=torch.int32), out=out)
        return y, out * 1, gdnconv.conv_update_multi(token, state, weight, bias, num_threads=1)

    g = torch.Generator().manual_seed(0)
    D, W = 48, 4
    args = [torch.randn(2, 7, D, generator=g).bfloat16(), torch.randn(2, 3, D, generator=g).bfloat16(),
            torch.randn(2, 1, D, generator=g).bfloat16(), torch.zeros(2, W - 1 + 2, D, dtype=torch.bfloat16),
            torch.randn(D, W, generator=g).bfloat16(), torch.randn(D, generator=g).bfloat16(),
            torch.empty(2, 3, D, dtype=torch.bfloat16)]
    _compiled_equals_eager(serve, args, [a.clone() for a in args], 3)


def test_compiled_with_aot_eager_matches_eager():
    """The aot_eager backend (functionalization of the in-place state update) gives the same bits."""
    def step(x, state, weight):
        return gdnconv.conv_update_multi(x, state, weight) * 2

    x, w = torch.randn(3, 2, 64), torch.randn(64, 4)
    state_a = torch.randn(3, 5, 64)
    state_b = state_a.clone()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(x, state_a, w)
    assert torch.equal(got, step(x, state_b, w)) and torch.equal(state_a, state_b)


@pytest.mark.parametrize("imports", ["import gdnconv, torch", "import torch, torch._dynamo, gdnconv"])
def test_any_import_order(imports):
    """gdnconv before torch (its substitutions wait for torch._dynamo's import, which gdnconv
    never triggers) and after torch._dynamo (registered at import): the plain call compiles."""
    r = run_python(imports + "\nimport sys\n"
                   "print('torch._dynamo' in sys.modules, 'gdnconv.torch' in sys.modules)\n"
                   "f = torch.compile(lambda x, s, w: gdnconv.conv_update_multi(x, s, w) + 1, fullgraph=True,\n"
                   "                  backend='eager')\n"
                   "x, s, w = torch.randn(1, 1, 16), torch.zeros(1, 3, 16), torch.randn(16, 4)\n"
                   "s2 = s.clone()\n"
                   "print(torch.equal(f(x, s, w), gdnconv.conv_update_multi(x, s2, w) + 1), torch.equal(s, s2))\n")
    assert r.returncode == 0, r.stderr
    first = "True True" if "_dynamo" in imports else "False False"
    assert r.stdout.split("\n")[:2] == [first, "True True"], r.stdout + r.stderr
    assert "RuntimeWarning" not in r.stderr, r.stderr


def test_eager_call_is_the_c_function():
    """The eager path is untouched: a C function (no Python frame in between) with the signature
    inspect reads; a NumPy caller never imports torch (tests/test_transformers.py checks the import)."""
    for f in (gdnconv.conv_update_multi, gdnconv.conv_prefill):
        assert isinstance(f, types.BuiltinFunctionType), type(f)
        assert list(inspect.signature(f).parameters)[:3] in (["x", "conv_state", "weight"], ["x", "weight", "bias"])
    r = run_python("import sys, numpy as np, gdnconv\n"
                   "gdnconv.conv_update_multi(np.ones((1, 1, 8), np.float32), np.zeros((1, 3, 8), np.float32),\n"
                   "                          np.ones((8, 4), np.float32))\n"
                   "print('torch' in sys.modules)")
    assert r.returncode == 0 and r.stdout.split() == ["False"], r.stdout + r.stderr


def test_substitute_a_python_function_and_a_mismatch_warns():
    """gdnconv._compile.substitute, the mechanism for the client layers: a function whose body
    cannot be traced (here: it goes through NumPy) compiles as its stand-in; a stand-in with
    another signature is refused with a RuntimeWarning, and the eager call still works."""
    r = run_python(
        "import warnings, gdnconv, torch\n"
        "from gdnconv import _compile\n"
        "def plain(x, scale=2):\n"
        "    return torch.from_numpy(x.numpy() * scale)\n"
        "def traceable(x, scale=2):\n"
        "    return x * scale\n"
        "def other(x):\n"
        "    return x\n"
        "_compile.substitute(plain, traceable)\n"
        "import torch._dynamo\n"
        "x = torch.arange(3.0)\n"
        "print(torch.compile(lambda t: plain(t) + 1, fullgraph=True, backend='eager')(x).tolist())\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    _compile.substitute(other, traceable)\n"
        "print([str(m.message).split(' (')[0] for m in w], other(x).tolist())\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[1.0, 3.0, 5.0]", "['gdnconv: torch.compile cannot trace other'] "
                                        "[0.0, 1.0, 2.0]"], r.stdout + r.stderr


def test_numpy_arrays_are_unaffected():
    """The C function keeps taking NumPy arrays after the substitutions are registered."""
    torch.compile(lambda t: t + 1, backend="eager")(torch.ones(1))     # torch._dynamo imported
    x, state, w = np.ones((1, 1, 8), np.float32), np.zeros((1, 3, 8), np.float32), np.ones((8, 4), np.float32)
    out = gdnconv.conv_update_multi(x, state, w, activation=None)
    assert isinstance(out, np.ndarray) and (out == 1).all() and (state[0, 2] == 1).all()


def test_vllm_functions_trace_with_the_eager_bits():
    """gdnconv.vllm's functions (vLLM's order and conventions, a packed weight, a varlen spec step
    with max_query_len) under torch.compile(fullgraph=True): the gdnconv:: ops in the graph, the
    eager calls' bits in outputs and state."""
    import gdnconv.vllm as gv

    def serve(prompt, draft, qsl, nat, slots, cache, weight, bias):
        y = gv.causal_conv1d_fn(prompt, weight, bias, cache, torch.tensor([0, 3, 7], dtype=torch.int32), slots,
                                is_weight_packed=True)
        z = gv.causal_conv1d_update(draft, cache, weight, bias, True, slots, nat, qsl, max_query_len=3,
                                    is_weight_packed=True)
        return y * 1, z * 1

    g = torch.Generator().manual_seed(1)
    D, W = 64, 4
    w = torch.randn(D, W, generator=g).bfloat16()
    args = [torch.randn(7, D, generator=g).bfloat16().T, torch.randn(5, D, generator=g).bfloat16(),
            torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32),
            torch.tensor([2, 0], dtype=torch.int32),
            torch.zeros(4, W - 1 + 2, D, dtype=torch.bfloat16).transpose(1, 2),   # vLLM's (S, D, L) view
            gv.pack_weight_like_vllm(w), torch.randn(D, generator=g).bfloat16()]
    _compiled_equals_eager(serve, args, [a.clone() if i != 5 else a.transpose(1, 2).clone().transpose(1, 2)
                                         for i, a in enumerate(args)], 5)
