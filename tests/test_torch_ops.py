"""gdnconv.torch: the registered torch.library ops, their fake implementations, torch.compile."""
import os

import pytest

from conftest import assert_bits_equal, run_python

torch = pytest.importorskip("torch")
import gdnconv  # noqa: E402
import gdnconv.torch as gt  # noqa: E402

# inductor compiles C++ (minutes on a busy 2-core machine); the default suite traces with
# aot_eager, which runs dynamo (fullgraph), functionalization and the fake implementations
BACKENDS = ["aot_eager"] + (["inductor"] if os.environ.get("GDNCONV_TEST_INDUCTOR") == "1" else [])


def _args(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    S, L, D, W, B, T = 6, 5, 40, 4, 3, 3
    state = torch.randn(S, L, D, generator=g).to(dtype)
    weight = torch.randn(D, W, generator=g).to(dtype)
    bias = torch.randn(D, generator=g).to(dtype)
    x = torch.randn(B, T, D, generator=g).to(dtype)
    nat = torch.tensor([1, 2, 2], dtype=torch.int32)
    slots = torch.tensor([4, -1, 2], dtype=torch.int32)
    return x, state, weight, bias, nat, slots


def test_schema_marks_the_state_and_out_mutated():
    schema = str(torch.ops.gdnconv.conv_update_multi.default._schema)
    assert "Tensor(a!) conv_state" in schema and "Tensor x," in schema
    schema_out = str(torch.ops.gdnconv.conv_update_multi_out.default._schema)
    assert "Tensor(a!) conv_state" in schema_out and "Tensor(b!) out" in schema_out


@pytest.mark.parametrize("given_out", [False, True])
def test_op_equals_plain_call(given_out):
    x, state, weight, bias, nat, slots = _args(1, torch.bfloat16)
    s1, s2 = state.clone(), state.clone()
    o1 = gdnconv.conv_update_multi(x, s1, weight, bias, num_accepted_tokens=nat, conv_state_indices=slots,
                                   out=torch.zeros_like(x) if given_out else None)
    out = torch.zeros_like(x) if given_out else None
    o2 = gt.conv_update_multi(x, s2, weight, bias, activation=True, num_accepted_tokens=nat,
                              conv_state_indices=slots, out=out)
    if given_out:
        assert o2 is out
    assert_bits_equal(o2, o1, "out")
    assert_bits_equal(s2, s1, "conv_state")


def test_fake_gives_the_real_shape_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode
    x, state, weight, bias, nat, slots = _args(2)
    real = torch.ops.gdnconv.conv_update_multi(x, state.clone(), weight, bias, "silu", nat, slots, None, -1)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)         # non-contiguous input
    real_t = torch.ops.gdnconv.conv_update_multi(xt, state.clone(), weight, bias, None, nat, slots, None, -1)
    with FakeTensorMode() as mode:
        fx, fs, fw, fb, fn, fi = (mode.from_tensor(t) for t in (x, state, weight, bias, nat, slots))
        fake = torch.ops.gdnconv.conv_update_multi(fx, fs, fw, fb, "silu", fn, fi, None, -1)
        fake_t = torch.ops.gdnconv.conv_update_multi(mode.from_tensor(xt), fs, fw, fb, None, fn, fi, None, -1)
    for f, r in ((fake, real), (fake_t, real_t)):
        assert (f.shape, f.stride(), f.dtype) == (r.shape, r.stride(), r.dtype)


def test_errors_pass_through_the_op_and_write_nothing():
    x, state, weight, bias, nat, slots = _args(3)
    before = state.clone()
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        gt.conv_update_multi(x, state, weight, bias, num_accepted_tokens=nat * 9, conv_state_indices=slots)
    assert torch.equal(state, before)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("given_out", [False, True])
def test_compile_fullgraph_equals_eager(backend, given_out):
    """torch.compile(fullgraph=True) of a function around the op: no graph break, outputs and
    state bit-identical to the eager call, ops before and after kept in order."""
    torch._dynamo.reset()
    x, state, weight, bias, nat, slots = _args(4)

    def step(x, state, weight, bias, nat, slots, out):
        before = state[4].clone()                          # read before the in-place update
        y = gt.conv_update_multi(x * 2, state, weight, bias, num_accepted_tokens=nat,
                                 conv_state_indices=slots, out=out)
        return y * 3 + 1, state[4] - before                # and after it

    s1, s2 = state.clone(), state.clone()
    o1 = torch.zeros_like(x) if given_out else None
    o2 = torch.zeros_like(x) if given_out else None
    eager = step(x, s1, weight, bias, nat, slots, o1)
    compiled = torch.compile(step, fullgraph=True, backend=backend)(x, s2, weight, bias, nat, slots, o2)
    for e, c in zip(eager, compiled):
        assert_bits_equal(c, e, "compiled result")
    assert_bits_equal(s2, s1, "conv_state")
    assert not torch.equal(s1, state)
    if given_out:
        assert_bits_equal(o2, o1, "out")


def test_importing_gdnconv_torch_registers_the_ops():
    r = run_python("import torch; print(hasattr(torch.ops.gdnconv, 'conv_update_multi')); import gdnconv.torch; "
                   "print(torch.ops.gdnconv.conv_update_multi.default.name())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "gdnconv::conv_update_multi"]
