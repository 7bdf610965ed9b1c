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


def _prefill_args(seed=0, dtype=torch.float32):
    """Three varlen requests (4, 0 and 5 tokens) into slots 4, 1, 2 of a (6, 5, 40) state; the
    first starts from its slot's rows, the others from zero history."""
    g = torch.Generator().manual_seed(seed)
    S, L, D, W = 6, 5, 40, 4
    state = torch.randn(S, L, D, generator=g).to(dtype)
    weight = torch.randn(D, W, generator=g).to(dtype)
    bias = torch.randn(D, generator=g).to(dtype)
    x = torch.randn(9, D, generator=g).to(dtype)
    qsl = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    init = torch.tensor([True, False, False])
    return x, weight, bias, state, qsl, slots, init


def test_prefill_schema_marks_the_state_and_out_mutated():
    schema = str(torch.ops.gdnconv.conv_prefill.default._schema)
    assert "Tensor(a!)? conv_state" in schema and schema.endswith("-> Tensor")
    schema_out = str(torch.ops.gdnconv.conv_prefill_out.default._schema)
    assert "Tensor(a!)? conv_state" in schema_out and "Tensor(b!) out" in schema_out


@pytest.mark.parametrize("given_out", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_op_equals_plain_call(given_out, dtype):
    x, weight, bias, state, qsl, slots, init = _prefill_args(5, dtype)
    s1, s2 = state.clone(), state.clone()
    kw = dict(query_start_loc=qsl, cache_indices=slots, has_initial_state=init)
    o1 = gdnconv.conv_prefill(x, weight, bias, conv_state=s1, out=torch.zeros_like(x) if given_out else None, **kw)
    out = torch.zeros_like(x) if given_out else None
    o2 = gt.conv_prefill(x, weight, bias, activation=True, conv_state=s2, out=out, **kw)
    if given_out:
        assert o2 is out
    assert_bits_equal(o2, o1, "out")
    assert_bits_equal(s2, s1, "conv_state")
    assert not torch.equal(s2, state)
    # no state: a convolution from zero history, nothing written
    o3 = gt.conv_prefill(x[None, :4], weight, bias, activation=None)
    assert_bits_equal(o3, gdnconv.conv_prefill(x[None, :4], weight, bias, activation=None), "stateless out")


def test_prefill_fake_gives_the_real_shape_and_strides():
    from torch._subclasses.fake_tensor import FakeTensorMode
    x, weight, bias, state, qsl, slots, init = _prefill_args(6)
    xt = x.t().contiguous().t()                                 # (N, D) with channel stride N
    x3 = x[None]                                                # (1, N, D) equal-length form
    real = [torch.ops.gdnconv.conv_prefill(x, weight, bias, "silu", state.clone(), qsl, slots, init, -1, None),
            torch.ops.gdnconv.conv_prefill(xt, weight, None, None, state.clone(), qsl, slots, None, -1, 1),
            torch.ops.gdnconv.conv_prefill(x3, weight, bias, "silu", None, None, None, None, -1, None)]
    with FakeTensorMode() as mode:
        fx, fxt, fx3, fw, fb, fs, fq, fi, fh = (mode.from_tensor(t) for t in (x, xt, x3, weight, bias, state, qsl,
                                                                              slots, init))
        fake = [torch.ops.gdnconv.conv_prefill(fx, fw, fb, "silu", fs, fq, fi, fh, -1, None),
                torch.ops.gdnconv.conv_prefill(fxt, fw, None, None, fs, fq, fi, None, -1, 1),
                torch.ops.gdnconv.conv_prefill(fx3, fw, fb, "silu", None, None, None, None, -1, None)]
    for f, r in zip(fake, real):
        assert (f.shape, f.stride(), f.dtype) == (r.shape, r.stride(), r.dtype)


def test_prefill_errors_pass_through_the_op_and_write_nothing():
    x, weight, bias, state, qsl, slots, init = _prefill_args(7)
    before = state.clone()
    with pytest.raises(ValueError, match="cache_indices"):
        gt.conv_prefill(x, weight, bias, conv_state=state, query_start_loc=qsl, cache_indices=slots * 3,
                        has_initial_state=init)
    assert torch.equal(state, before)


def _assert_unchanged(t, before, what):
    if t.dtype.is_floating_point:
        assert_bits_equal(t, before, what)
    else:
        assert torch.equal(t, before), what


def _op_calls():
    """(op, call(args), args): each registered op with its tensor arguments by name."""
    x, state, weight, bias, nat, slots = _args(8)
    yield ("conv_update_multi", lambda a: gt.conv_update_multi(
        a["x"], a["conv_state"], a["weight"], a["bias"], num_accepted_tokens=a["num_accepted_tokens"],
        conv_state_indices=a["conv_state_indices"], out=a.get("out")),
        dict(x=x, conv_state=state, weight=weight, bias=bias, num_accepted_tokens=nat, conv_state_indices=slots))
    x, weight, bias, state, qsl, slots, init = _prefill_args(8)
    yield ("conv_prefill", lambda a: gt.conv_prefill(
        a["x"], a["weight"], a["bias"], conv_state=a["conv_state"], query_start_loc=a["query_start_loc"],
        cache_indices=a["cache_indices"], has_initial_state=a["has_initial_state"], out=a.get("out")),
        dict(x=x, weight=weight, bias=bias, conv_state=state, query_start_loc=qsl, cache_indices=slots,
             has_initial_state=init))


@pytest.mark.parametrize("given_out", [False, True])
def test_one_meta_tensor_among_cpu_ones_is_refused(given_out):
    """Issue 24, fault 3: one meta argument sends the call to the fake kernel, which
    returned an uninitialised tensor and wrote nothing; it raises as torch's own ops do,
    naming the devices, and the CPU buffers stay as they were. All-meta calls still
    infer the shape."""
    n = 0
    for op, call, args in _op_calls():
        if given_out:
            args["out"] = torch.full(args["x"].shape, 7.0, dtype=args["x"].dtype)
        for name in args:
            a = dict(args, **{name: args[name].to("meta")})
            before = {k: t.clone() for k, t in a.items() if t.device.type == "cpu"}
            with pytest.raises(RuntimeError) as info:
                call(a)
            op_name = op + ("_out" if given_out else "")
            assert str(info.value).startswith(f"gdnconv::{op_name}: expected all tensors to be on the same device"), \
                str(info.value)
            assert f"{name} on meta" in str(info.value) and "x on " in str(info.value), str(info.value)
            for k, t in before.items():
                _assert_unchanged(a[k], t, f"{op} {k} (meta {name})")
            n += 1
        meta = {k: t.to("meta") for k, t in args.items()}
        result = call(meta)
        assert result.device.type == "meta" and result.shape == args["x"].shape
    assert n == 13 + 2 * given_out


@pytest.mark.parametrize("given_out", [False, True])
def test_inference_tensors_follow_torchs_rule(given_out):
    """Issue 24, fault 6: a conv_state (or out) made under torch.inference_mode() is not
    written outside it (torch refuses that for its own in-place ops): refused with the
    fix, nothing written; inside inference mode the call runs as with normal tensors."""
    for op, call, args in _op_calls():
        args["out"] = torch.full(args["x"].shape, 7.0) if given_out else None
        want = dict(args, conv_state=args["conv_state"].clone(), out=None if args["out"] is None else args["out"].clone())
        want_out = call(want)
        for name in ("conv_state", "out") if given_out else ("conv_state",):
            with torch.inference_mode():
                inference = args[name].clone()
            a = dict(args, conv_state=args["conv_state"].clone())
            a[name] = inference
            before = {k: t.clone() for k, t in a.items() if t is not None}
            with pytest.raises(ValueError) as info:
                call(a)
            assert str(info.value).startswith(f"{name} is an inference tensor"), str(info.value)
            assert "torch.inference_mode()" in str(info.value) and f"{name}.clone()" in str(info.value)
            for k, t in before.items():
                _assert_unchanged(a[k], t, f"{op} {k}")
            with torch.inference_mode():
                got = call(a)
            assert_bits_equal(got, want_out, f"{op} out")
            assert_bits_equal(a["conv_state"], want["conv_state"], f"{op} conv_state")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("given_out", [False, True])
def test_compile_prefill_then_update_equals_eager(backend, given_out):
    """torch.compile(fullgraph=True) of a step that prefills three prompts and then decodes one
    token for each through the ops: no graph break, outputs and state bit-identical to eager."""
    torch._dynamo.reset()
    x, weight, bias, state, qsl, slots, init = _prefill_args(8)
    g = torch.Generator().manual_seed(9)
    tok = torch.randn(3, 1, x.shape[1], generator=g)

    def step(x, tok, state, weight, bias, qsl, slots, init, out):
        y = gt.conv_prefill(x * 2, weight, bias, conv_state=state, query_start_loc=qsl, cache_indices=slots,
                            has_initial_state=init, out=out)
        after_prefill = state[2].clone()
        z = gt.conv_update_multi(tok, state, weight, bias, conv_state_indices=slots)
        return y + 1, z * 3, after_prefill

    s1, s2 = state.clone(), state.clone()
    o1 = torch.zeros_like(x) if given_out else None
    o2 = torch.zeros_like(x) if given_out else None
    eager = step(x, tok, s1, weight, bias, qsl, slots, init, o1)
    compiled = torch.compile(step, fullgraph=True, backend=backend)(x, tok, s2, weight, bias, qsl, slots, init, o2)
    for e, c in zip(eager, compiled):
        assert_bits_equal(c, e, "compiled result")
    assert_bits_equal(s2, s1, "conv_state")
    assert not torch.equal(s1[2], eager[2])            # the update moved the state on after the prefill
    if given_out:
        assert_bits_equal(o2, o1, "out")


def test_importing_gdnconv_torch_registers_the_ops():
    r = run_python("import torch; print(hasattr(torch.ops.gdnconv, 'conv_update_multi')); import gdnconv.torch; "
                   "print(torch.ops.gdnconv.conv_update_multi.default.name(), "
                   "torch.ops.gdnconv.conv_prefill.default.name())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "gdnconv::conv_update_multi", "gdnconv::conv_prefill"]
