"""Faults found by sanitizers and fuzzing (issues 11 and 24), each as the class it
belongs to: buffers freed under a running kernel (at interpreter exit, by user code
that an argument's conversion runs, or by torch code a __torch_function__ override
runs during the call), views past their storage, forked children that hang in
OpenMP, unbounded overlap checks, thread defaults under OMP_PROC_BIND, and the
build's OpenMP probe.

Crashes and hangs run in a fresh interpreter (``run_python``), hangs with a deadline.
MALLOC_MMAP_THRESHOLD_ makes glibc map every large buffer on its own, so that a
buffer freed under the kernel is unmapped and touching it crashes every time."""
import os
import platform
import sys

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import gdnconv
from conftest import assert_bits_equal, bits, reference, run_python
from gdnconv.testing import assert_outputs_close

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="fork, glibc and OMP_PROC_BIND behaviour of Linux")
UNMAP_FREED = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _ok(r, expect="OK"):
    assert r.returncode == 0, f"exit status {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-3000:]}"
    assert r.stdout.strip().endswith(expect), r.stdout


# ------------------------------------------------- buffers the kernel touches at exit

EXIT_DURING_CALLS = """
import threading
import numpy as np, ml_dtypes, gdnconv
bf = ml_dtypes.bfloat16
D = 8192
def kinds():
    # the weight scratch (bf16 weights, more requests than threads) on one and on all
    # threads, a new out
    w = np.ones((D, 4), bf)
    for threads in (1, 1, None):
        x = np.ones((32, 4, D), bf); st = np.zeros((32, 6, D), bf); n = np.ones(32, np.int32)
        yield lambda x=x, st=st, n=n, threads=threads: gdnconv.conv_update_multi(
            x, st, w, None, num_accepted_tokens=n, num_threads=threads)
    # a contiguous copy of x, index arrays converted from lists, a given out
    xs = np.ones((16, 4, 2 * D), bf)[..., ::2]; st2 = np.zeros((16, 6, D), bf); o = np.empty((16, 4, D), bf)
    yield lambda: gdnconv.conv_update_multi(xs, st2, w, None, num_accepted_tokens=[1] * 16,
                                            conv_state_indices=list(range(16)), out=o)
    # byte-swapped fp32 weights and bias (native copies)
    x3 = np.ones((16, 1, D), np.float32); st3 = np.zeros((16, 3, D), np.float32)
    w3 = np.ones((D, 4), ">f4"); b3 = np.ones(D, ">f4")
    yield lambda: gdnconv.conv_update_multi(x3, st3, w3, b3, num_threads=1)
started = []
for call in kinds():
    ev = threading.Event()
    started.append(ev)
    def loop(call=call, ev=ev):
        call()
        ev.set()
        while True:
            call()
    threading.Thread(target=loop, daemon=True).start()
for ev in started:
    ev.wait()
print("OK")
"""   # ... and the interpreter exits while the daemon threads are inside calls


@pytest.mark.parametrize("name", gdnconv.available_isas())
def test_exit_while_daemon_threads_are_in_calls(name):
    """Every buffer a call's kernel reads or writes is held by the call, so tearing the
    interpreter down under a running kernel frees none of them (a freed per-thread weight
    scratch crashed the avx512 kernel)."""
    for _ in range(3):
        _ok(run_python(EXIT_DURING_CALLS, GDNCONV_ISA=name, **UNMAP_FREED))


# --------------------------------------- user code run by an argument's conversion

CONVERSION_FREES = """
import numpy as np, torch, gdnconv
D = 4096
def args():
    return dict(x=torch.ones(2, 1, D), conv_state=torch.zeros(64, 3, D), weight=torch.ones(D, 4),
                out=torch.empty(2, 1, D))
def frees(a, victim):
    def run():
        a[victim].set_(torch.empty(0))
    return run
class ArrayHook:                       # np.asarray(...) runs __array__
    def __init__(self, run, value): self.run, self.value = run, value
    def __array__(self, dtype=None, copy=None):
        self.run(); return np.array(self.value, np.int32)
class SequenceHook:                    # np.asarray(...) of a sequence runs __len__ / __getitem__
    def __init__(self, run, value): self.run, self.value = run, value
    def __len__(self): self.run(); return len(self.value)
    def __getitem__(self, i): return self.value[i]
n = 0
for hook in (ArrayHook, SequenceHook):
    for arg, value in (("conv_state_indices", [62, 63]), ("num_accepted_tokens", [1, 1]),
                       ("query_start_loc", [0, 1, 2])):
        for victim in ("conv_state", "x", "weight", "out"):
            a = args()
            kw = {arg: hook(frees(a, victim), value)}
            if arg == "query_start_loc":
                a["x"], a["out"] = a["x"][:, 0], a["out"][:, 0]
            if arg == "num_accepted_tokens":
                kw["conv_state_indices"] = np.array([62, 63], np.int32)
            try:
                gdnconv.conv_update_multi(a["x"], a["conv_state"], a["weight"], out=a["out"], **kw)
            except ValueError as e:   # the victim, now empty, is refused
                assert victim in str(e), (arg, victim, str(e))
            else:
                raise AssertionError(f"{hook.__name__} {arg} freeing {victim}: call accepted")
            n += 1
print(n, "OK")
"""


def test_conversion_that_frees_another_argument():
    """Index arguments are converted (running __array__ / __len__) before any pointer is
    taken: user code that gives conv_state, x, weight or out new memory then meets a
    shape check, not a kernel writing into the freed memory."""
    pytest.importorskip("torch")
    _ok(run_python(CONVERSION_FREES, **UNMAP_FREED), "24 OK")


TENSOR_HOOKS = """
import numpy as np, torch, gdnconv
D = 4096
st = torch.zeros(64, 3, D); idx = torch.tensor([62, 63], dtype=torch.int32)
victims = {"conv_state": st, "conv_state_indices": idx}
class Hooked(torch.Tensor):
    fire = None   # (torch function, victim): that function frees the victim's memory
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if cls.fire is not None and func is cls.fire[0]:
            victims[cls.fire[1]].set_(torch.empty(0, dtype=victims[cls.fire[1]].dtype))
            cls.fire = None
        return super().__torch_function__(func, types, args, kwargs or {})
w = torch.ones(D, 4)
for func, victim, x in ((torch.empty_like, "conv_state", torch.ones(2, 1, D)),
                        (torch.empty_like, "conv_state_indices", torch.ones(2, 1, D)),
                        (torch.Tensor.contiguous, "conv_state", torch.ones(2, 1, 2 * D)[..., ::2])):
    st.set_(torch.zeros(64, 3, D)); idx.set_(torch.tensor([62, 63], dtype=torch.int32))
    Hooked.fire = (func, victim)
    out = gdnconv.conv_update_multi(x.as_subclass(Hooked), st, w, conv_state_indices=idx)
    assert Hooked.fire is None, "the hook did not run"
    assert torch.allclose(out.as_subclass(torch.Tensor), torch.nn.functional.silu(torch.ones(2, 1, D))), out
print("OK")
"""


def test_tensor_given_new_memory_while_the_call_runs():
    """torch code that runs after the call read a tensor's pointer (a subclass's
    __torch_function__ in empty_like or contiguous) cannot free the memory under the
    kernel: the call holds each tensor's storage through its DLPack capsule, and
    writes the update where the tensor's memory was when the call read it."""
    pytest.importorskip("torch")
    _ok(run_python(TENSOR_HOOKS, **UNMAP_FREED))


SHRINKING_HOOKS = """
import numpy as np, torch, gdnconv, gdnconv.torch as gt
from torch.overrides import TorchFunctionMode
D = 4096
def raw(t):      # the bytes of a tensor as they are now
    return bytes(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
class Fire:      # on the first call of torch function `func`, shrink the victim's storage
    func = victim = None
    @classmethod
    def check(cls, func):
        if cls.func is not None and getattr(func, "__name__", None) == cls.func:
            cls.func, victim, cls.victim = None, cls.victim, None
            victim.untyped_storage().resize_(2)   # (smaller than any argument)
class Hooked(torch.Tensor):   # a subclass's __torch_function__
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Fire.check(func)
        return super().__torch_function__(func, types, args, kwargs or {})
class Mode(TorchFunctionMode):  # a mode's: sees every torch function on every tensor
    def __torch_function__(self, func, types, args=(), kwargs=None):
        Fire.check(func)
        return func(*args, **(kwargs or {}))
def args(op, new_out, strided_x):
    a = dict(x=torch.ones(2, 1, D) if op == "update" else torch.ones(1, 64, D),
             conv_state=torch.full((64, 3, D), 0.5), weight=torch.ones(D, 4), bias=torch.ones(D),
             indices=torch.tensor([62, 63] if op == "update" else [63], dtype=torch.int32))
    if strided_x:
        a["x"] = torch.ones(*a["x"].shape[:2], 2 * D)[..., ::2]
    a["out"] = None if new_out else torch.full(a["x"].shape, 7.0)
    a["flags"] = None if op == "update" else torch.tensor([True])
    return a
def call(op, via, a):
    if op == "update":
        f = gt.conv_update_multi if via == "op" else gdnconv.conv_update_multi
        return f(a["x"], a["conv_state"], a["weight"], a["bias"], conv_state_indices=a["indices"], out=a["out"])
    f = gt.conv_prefill if via == "op" else gdnconv.conv_prefill
    return f(a["x"], a["weight"], a["bias"], conv_state=a["conv_state"], cache_indices=a["indices"],
             has_initial_state=a["flags"], out=a["out"])
fired = refused = 0
for op in ("update", "prefill"):
    for via in ("gdnconv", "op"):
        for func in ("is_neg", "untyped_storage", "__get__", "numpy", "empty_like", "empty", "clone", "contiguous"):
            for hooked in ("x", "conv_state", "weight", "bias", "flags", "mode"):
                for victim in ("x", "conv_state", "weight", "bias", "indices", "out"):
                    if victim == hooked:
                        continue
                    if (func == "clone" and op != "prefill") or (func == "contiguous" and op != "update"):
                        continue   # (the op makes no such copy)
                    if func in ("clone", "contiguous") and victim == "x":
                        continue   # (torch's own copy would read the freed memory)
                    new_out = func in ("empty_like", "empty", "contiguous")
                    a = args(op, new_out, func in ("empty", "contiguous"))   # (a new out for a strided x: empty)
                    if a[hooked if hooked != "mode" else "x"] is None:
                        continue
                    if func == "clone":        # conv_prefill clones x when out is x
                        a["out"] = a["x"]
                    if a[victim] is None or victim == "flags" or (victim == "out" and a["out"] is a["x"]):
                        continue
                    before = {k: raw(t) for k, t in a.items() if t is not None and k != victim}
                    if hooked != "mode":
                        a[hooked] = a[hooked].as_subclass(Hooked)
                    Fire.func, Fire.victim = func, a[victim]
                    try:
                        if hooked == "mode":
                            with Mode():
                                call(op, via, a)
                        else:
                            call(op, via, a)
                    except ValueError as e:
                        assert Fire.func is None, (op, via, func, hooked, victim, "refused before the hook", str(e))
                        name = "cache_indices" if op == "prefill" else "conv_state_indices"
                        assert str(e).startswith((victim if victim != "indices" else name) + " lies outside its storage"), \\
                            (op, via, func, hooked, victim, str(e))
                        after = {k: raw(a[k]) for k in before}
                        assert after == before, (op, via, func, hooked, victim, "a refused call wrote")
                        refused += 1
                    else:
                        assert Fire.func is not None, f"{op} {via}: {func} of {hooked} shrank {victim}: accepted"
                    fired += Fire.func is None
                    Fire.func = None
print(fired, refused, "OK")
"""


def test_torch_hook_that_shrinks_a_storage_is_refused():
    """Issue 24, fault 1: torch code that a subclass's or a mode's __torch_function__
    runs after the call took pointers (is_neg and untyped_storage in a view, the
    requires_grad getter, numpy for has_initial_state, empty_like or empty for a new
    out, clone or contiguous for a copy of x) shrinks another argument's storage: the call refuses, naming that argument,
    and writes nothing, instead of the kernel using freed memory (a segfault before)."""
    pytest.importorskip("torch")
    r = run_python(SHRINKING_HOOKS, timeout=600, **UNMAP_FREED)
    _ok(r)
    fired, refused = map(int, r.stdout.split()[-3:-1])
    assert fired == refused and fired >= 100, r.stdout


SHRUNK_BEFORE = """
import torch, gdnconv
D = 4096
def raw(t):
    return bytes(t.detach().view(-1).view(torch.uint8).numpy())
n = 0
for op in ("update", "prefill"):
    for victim in ("x", "conv_state", "weight", "bias", "indices", "out", "query_start_loc"):
        a = dict(x=torch.ones(3, D), conv_state=torch.full((64, 3, D), 0.5), weight=torch.ones(D, 4),
                 bias=torch.ones(D), indices=torch.tensor([61, 62, 63], dtype=torch.int32),
                 out=torch.full((3, D), 7.0), query_start_loc=torch.tensor([0, 1, 2, 3], dtype=torch.int32))
        before = {k: raw(t) for k, t in a.items() if k != victim}
        a[victim].untyped_storage().resize_(8)
        name = {"indices": "cache_indices" if op == "prefill" else "conv_state_indices"}.get(victim, victim)
        try:
            if op == "update":
                gdnconv.conv_update_multi(a["x"], a["conv_state"], a["weight"], a["bias"], out=a["out"],
                                          conv_state_indices=a["indices"], query_start_loc=a["query_start_loc"])
            else:
                gdnconv.conv_prefill(a["x"], a["weight"], a["bias"], conv_state=a["conv_state"], out=a["out"],
                                     cache_indices=a["indices"], query_start_loc=a["query_start_loc"])
        except ValueError as e:
            assert str(e).startswith(name + " lies outside its storage: its elements span bytes 0.."), (op, str(e))
            assert "of a storage of 8 bytes" in str(e), str(e)
        else:
            raise AssertionError(f"{op}: {victim} past its storage accepted")
        assert {k: raw(a[k]) for k in before} == before, (op, victim, "a refused call wrote")
        n += 1
print(n, "OK")
"""


SHRUNK_TO_NOTHING = """
import torch, gdnconv
D = 64
n = 0
for op in ("update", "prefill"):
    for victim in ("indices", "num_accepted_tokens", "has_initial_state"):
        if (op, victim) in (("update", "has_initial_state"), ("prefill", "num_accepted_tokens")):
            continue
        st = torch.full((64, 6, D), 0.5); before = st.clone(); out = torch.full((2, 1, D), 7.0)
        a = dict(indices=torch.tensor([61, 62], dtype=torch.int32), num_accepted_tokens=torch.tensor([1, 1]),
                 has_initial_state=torch.tensor([True, True]))
        a[victim].untyped_storage().resize_(0)   # no memory: .numpy() would read freed memory
        name = {"indices": "cache_indices" if op == "prefill" else "conv_state_indices"}.get(victim, victim)
        try:
            if op == "update":
                gdnconv.conv_update_multi(torch.ones(2, 1, D), st, torch.ones(D, 4), out=out,
                                          conv_state_indices=a["indices"], num_accepted_tokens=a[victim]
                                          if victim == "num_accepted_tokens" else None)
            else:
                gdnconv.conv_prefill(torch.ones(2, 1, D), torch.ones(D, 4), conv_state=st, out=out,
                                     cache_indices=a["indices"], has_initial_state=a[victim]
                                     if victim == "has_initial_state" else None)
        except ValueError as e:
            assert str(e).startswith(name + " lies outside its storage: its elements span bytes 0.."), (op, str(e))
            assert "of a storage of 0 bytes" in str(e), str(e)
        else:
            raise AssertionError(f"{op}: {victim} without storage accepted")
        assert torch.equal(st, before) and torch.equal(out, torch.full((2, 1, D), 7.0)), (op, victim, "wrote")
        n += 1
print(n, "OK")
"""


def test_index_without_storage_is_refused():
    """An index or flag tensor whose storage was shrunk to nothing has no pointer to read in
    place, and its values were read through .numpy() past the storage (the conversion of
    an int64 or bool tensor too): refused, naming the argument, with nothing written."""
    pytest.importorskip("torch")
    _ok(run_python(SHRUNK_TO_NOTHING, **UNMAP_FREED), "4 OK")


def test_view_past_its_storage_is_refused():
    """Issue 24, fault 2: a tensor whose storage was shrunk (untyped_storage().resize_())
    no longer holds its view; torch refuses such a tensor, and so does each op, naming
    the argument (a shrunk conv_state is not reported as an overlap), with every
    buffer unchanged (before: reads past the storage, and an 'x overlaps conv_state')."""
    pytest.importorskip("torch")
    _ok(run_python(SHRUNK_BEFORE, **UNMAP_FREED), "14 OK")


LIAR = """
import torch, gdnconv
D = 4096
class Liar(torch.Tensor):   # its empty_like / clone / contiguous return Liar.give (when set)
    give = None
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in ("empty_like", "clone", "contiguous") and cls.give is not None:
            return cls.give
        return super().__torch_function__(func, types, args, kwargs or {})
"""

WRONG_COPY = LIAR + """
# Liar.give: a tensor of another shape or dtype
n = 0
for op in ("update", "prefill"):
    for give in (torch.empty(1), torch.empty(2, 1, D, dtype=torch.float16), torch.empty(2, 2, D)):
        for copy in ("new out", "x copy"):
            x = torch.ones(2, 1, 2 * D)[..., ::2] if copy == "x copy" and op == "update" else torch.ones(2, 1, D)
            st = torch.full((4, 3, D), 0.5); before = st.clone()
            out = x if copy == "x copy" and op == "prefill" else None   # (prefill copies x when out is x)
            Liar.give = give
            try:
                if op == "update":
                    gdnconv.conv_update_multi(x.as_subclass(Liar), st, torch.ones(D, 4), out=out)
                else:
                    gdnconv.conv_prefill(x.as_subclass(Liar), torch.ones(D, 4), conv_state=st, out=out)
            except TypeError as e:
                assert " the call made (torch.empty_like, .clone() or .contiguous() of x) has shape " in str(e), str(e)
                assert torch.equal(st, before), "a refused call wrote"
                n += 1
            else:
                raise AssertionError(f"{op} {copy}: a {tuple(give.shape)} {give.dtype} accepted")
print(n, "OK")
"""


def test_copy_of_the_wrong_shape_from_an_override_is_refused():
    """A __torch_function__ override of empty_like, clone or contiguous may return any
    tensor: a new out or copy of x that does not have x's shape and dtype is refused
    (the kernel would write or read it with x's shape)."""
    pytest.importorskip("torch")
    _ok(run_python(WRONG_COPY, **UNMAP_FREED), "12 OK")


ALIASED_COPY = LIAR + """
# Liar.give: memory the call writes or reads
n = 0
for op in ("update", "prefill"):
    for copy, victim, expect in (("new out", "conv_state", "out overlaps conv_state"),
                                 ("new out", "weight", "weight overlaps out"),
                                 ("x copy", "conv_state", "x overlaps conv_state")):
        x = torch.ones(2, 1, 2 * D)[..., ::2] if copy == "x copy" and op == "update" else torch.ones(2, 1, D)
        st = torch.full((4, 3, D), 0.5); w = torch.ones(D, 4); before, w_before = st.clone(), w.clone()
        out = x if copy == "x copy" and op == "prefill" else None   # (prefill copies x when out is x)
        x_before = x.clone()
        Liar.give = w.view(-1)[:2 * D].view(2, 1, D) if victim == "weight" else st[:2, :1]
        try:
            if op == "update":
                gdnconv.conv_update_multi(x.as_subclass(Liar), st, w, out=out)
            else:
                gdnconv.conv_prefill(x.as_subclass(Liar), w, conv_state=st, out=out)
        except ValueError as e:
            assert str(e).startswith(expect), (op, copy, victim, str(e))
            assert torch.equal(st, before) and torch.equal(w, w_before) and torch.equal(x, x_before), "a refused call wrote"
            n += 1
        else:
            raise AssertionError(f"{op} {copy}: memory of {victim} accepted")
print(n, "OK")
"""


def test_copy_over_written_or_read_memory_from_an_override_is_refused():
    """A __torch_function__ override of empty_like, clone or contiguous may return memory the
    call writes (conv_state) or reads (weight): the aliasing rules hold for the new out and x's
    copy as for the caller's arguments (the kernel would write the state through out, or read
    x while writing it); nothing is written."""
    pytest.importorskip("torch")
    _ok(run_python(ALIASED_COPY, **UNMAP_FREED), "6 OK")


# --------------------------------------------------------------------- fork

FORK_CHILD = """
import ctypes, os, sys, time
import numpy as np
import gdnconv
from gdnconv.reference import conv_update_multi_ref
owner, how = sys.argv[1], sys.argv[2]
if owner == "torch":           # torch's libgomp starts the pool gdnconv shares
    import torch
    torch.set_num_threads(2)
    a = torch.randn(500, 500); a @ a
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 4, 8192)).astype(np.float32)
st = rng.standard_normal((16, 6, 8192)).astype(np.float32)
w = rng.standard_normal((8192, 4)).astype(np.float32)
if owner == "gdnconv":         # gdnconv's own parallel region starts it
    gdnconv.conv_update_multi(x, st.copy(), w, num_threads=2)
libc = ctypes.CDLL(None, use_errno=True)
pid = {"os.fork": os.fork, "libc fork": libc.fork,         # libc: no os.register_at_fork hooks
       "raw fork syscall": lambda: libc.syscall(57)}[how]()  # no pthread_atfork handlers either
if pid == 0:
    ref, ref_st = conv_update_multi_ref(x, st, w)
    out = gdnconv.conv_update_multi(x, st, w, num_threads=2)
    good = np.allclose(out, ref, rtol=1e-5, atol=1e-5) and (st.view(np.uint32) == ref_st.view(np.uint32)).all()
    os._exit(0 if good else 3)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child HUNG in a call")
"""


@linux_only
@pytest.mark.parametrize("how", ["os.fork", "libc fork", "raw fork syscall"])
@pytest.mark.parametrize("owner", ["torch", "gdnconv", "nobody"])
def test_forked_child_never_hangs(owner, how):
    """A forked child runs its calls on one thread, whoever started the OpenMP pool
    before the fork (torch's libgomp is the same runtime) and however it forked, and
    gets the right results."""
    if owner == "torch":
        pytest.importorskip("torch")
    if how == "raw fork syscall" and platform.machine() != "x86_64":
        pytest.skip("the fork syscall number used is x86-64's")
    r = run_python(FORK_CHILD.replace("sys.argv[1], sys.argv[2]", repr((owner, how))))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "child exit 0", r.stdout


# ------------------------------------------------------------ overlap checks

def _strided(buf, offset, shape, strides, writeable=False):
    """A view of buf starting offset elements in, strides in elements."""
    k = buf.itemsize
    return as_strided(buf[offset:], shape, tuple(k * s for s in strides), writeable=writeable)


def _buffer(seed):
    return np.random.default_rng(seed).standard_normal(400_000).astype(np.float32)


def _undecided(a, b):
    """The bound gdnconv gives NumPy's search (see _core._shares) is too small for a, b."""
    try:
        np.shares_memory(a, b, max_work=16 + (a.size + b.size) // 256)
    except np.exceptions.TooHardError:
        return True
    return False


# Views of one fp32 buffer whose overlap NumPy's exact search needs seconds to minutes
# to decide (found by a random search; sizes and strides in elements). Each case
# returns (arguments of a legal call, the undecided pair, what is written).
def _case_out_vs_conv_state(rng):
    buf = _buffer(3)
    st = _strided(buf, 0, (3, 3, 1231), (8299, 2556, 2), writeable=True)
    out = _strided(buf, 251, (47, 1, 1231), (7627, 7598, 6), writeable=True)
    x = rng.standard_normal(out.shape).astype(np.float32)
    return dict(x=x, conv_state=st, out=out), (out, st), buf


def _case_x_vs_conv_state(rng):
    buf = _buffer(3)
    st = _strided(buf, 0, (3, 3, 1231), (8299, 2556, 2), writeable=True)
    x = _strided(buf, 251, (47, 1, 1231), (7627, 7598, 6))
    return dict(x=x, conv_state=st), (x, st), buf


def _case_x_vs_out(rng):
    buf = _buffer(5)
    out = _strided(buf, 0, (2, 2, 933), (4455, 2111, 2), writeable=True)
    x = _strided(buf, 1924, (2, 2, 933), (472, 3871, 4))
    st = rng.standard_normal((3, 4, 933)).astype(np.float32)
    return dict(x=x, conv_state=st, out=out), (x, out), buf


def _case_weight_vs_conv_state(rng):
    buf = _buffer(4)
    st = _strided(buf, 0, (3, 6, 1488), (28955, 4653, 3), writeable=True)
    w = _strided(buf, 748, (1488, 7), (33, 2))
    x = rng.standard_normal((3, 1, 1488)).astype(np.float32)
    return dict(x=x, conv_state=st, weight=w), (w, st), buf


def _case_bias_vs_conv_state(rng):
    buf = _buffer(6)
    st = _strided(buf, 0, (3, 5, 1487), (23252, 4587, 3), writeable=True)
    b = _strided(buf, 1312, (1487,), (27,))
    x = rng.standard_normal((3, 1, 1487)).astype(np.float32)
    return dict(x=x, conv_state=st, bias=b), (b, st), buf


def _case_indices_vs_conv_state(rng):
    buf = _buffer(7)
    st = _strided(buf, 0, (2, 7, 536), (9202, 1261, 2), writeable=True)
    idx = buf.view(np.int32)[1134:1134 + 291]     # int32 contiguous: used in place
    idx[:] = -1
    idx[[5, 100]] = [1, 0]
    x = rng.standard_normal((291, 1, 536)).astype(np.float32)
    return dict(x=x, conv_state=st, conv_state_indices=idx), (idx, st), buf


UNDECIDED_READS = {"x-vs-conv_state": _case_x_vs_conv_state, "x-vs-out": _case_x_vs_out,
                   "weight-vs-conv_state": _case_weight_vs_conv_state,
                   "bias-vs-conv_state": _case_bias_vs_conv_state,
                   "conv_state_indices-vs-conv_state": _case_indices_vs_conv_state}


def _full_call(rng, args):
    """args completed to a legal plain call (fp32, W from the weight or 4)."""
    D = args["conv_state"].shape[2]
    w = args.get("weight")
    if w is None:
        w = (rng.standard_normal((D, 4)) / 2).astype(np.float32)
    B = args["x"].shape[0]
    idx = args.get("conv_state_indices")
    if idx is None:
        idx = np.full(B, -1, np.int32)
        idx[:min(B, args["conv_state"].shape[0])] = np.arange(min(B, args["conv_state"].shape[0]))
    return dict(x=args["x"], conv_state=args["conv_state"], weight=w, bias=args.get("bias"),
                kw=dict(activation="silu", num_accepted_tokens=None, conv_state_indices=idx,
                        query_start_loc=None, pad_slot_id=-1))


OVERLAP_ISSUE_EXAMPLE = """
import numpy as np, gdnconv
from numpy.lib.stride_tricks import as_strided
buf = np.zeros(200_000, np.float32)
st = as_strided(buf, (3, 8, 1166), (4 * 28793, 4 * 3537, 12), writeable=True)
x = as_strided(buf[373:], (45, 3, 1166), (4 * 414, 4 * 3096, 24))
gdnconv.conv_update_multi(x, st, np.ones((1166, 4), np.float32), None,
                          conv_state_indices=np.full(45, -1, np.int32))
print("OK")
"""


def test_overlap_check_is_bounded_issue_example():
    """The issue's no-op call whose exact overlap check took ~30 s: x is read from a copy.
    (The deadline only detects the unbounded search; the call takes milliseconds.)"""
    _ok(run_python(OVERLAP_ISSUE_EXAMPLE, timeout=20))


def test_undecided_written_pair_is_refused(rng):
    """out and conv_state whose overlap cannot be decided in bounded work: refused with
    a "may overlap" error naming both and the fix, nothing written."""
    args, pair, buf = _case_out_vs_conv_state(rng)
    assert _undecided(*pair)
    call = _full_call(rng, args)
    before = bits(buf)
    with pytest.raises(ValueError, match="out may overlap conv_state") as info:
        gdnconv.conv_update_multi(call["x"], call["conv_state"], call["weight"], out=args["out"], **call["kw"])
    assert "separate allocations" in str(info.value)
    assert np.array_equal(bits(buf), before), "a refused call wrote the buffer"


@pytest.mark.parametrize("case", UNDECIDED_READS)
def test_undecided_read_input_is_copied(case, rng):
    """A read-only input whose overlap with a written array cannot be decided in bounded
    work is read from a private copy: the call runs and matches the reference computed
    on copies of the inputs taken before it (these pairs do share memory)."""
    args, pair, buf = UNDECIDED_READS[case](rng)
    assert _undecided(*pair)
    call = _full_call(rng, args)
    x, out = call["x"], args.get("out")
    ref_out, ref_state, mag = reference(x, call["conv_state"], call["weight"], call["bias"], **call["kw"])
    live = call["kw"]["conv_state_indices"] != -1    # (before the call: it may write their memory)
    res = gdnconv.conv_update_multi(x, call["conv_state"], call["weight"], call["bias"], out=out, **call["kw"])
    if out is not None:
        assert res is out
    assert_outputs_close(res[live], ref_out[live], mag[live], np.float32, silu=True)
    assert_bits_equal(call["conv_state"], ref_state, "conv_state")


# ------------------------------------------------------------ thread defaults

THREADS = """
import os
{pre}import gdnconv
default = gdnconv.get_num_threads()
gdnconv.set_num_threads(64)
print(default, gdnconv.get_num_threads(), len(os.sched_getaffinity(0)))
"""


@linux_only
@pytest.mark.parametrize("torch_first", [False, True], ids=["gdnconv", "torch-then-gdnconv"])
@pytest.mark.parametrize("bind", ["true", "close", "spread"])
def test_thread_default_whatever_the_binding(bind, torch_first):
    """With OMP_PROC_BIND, libgomp pins the main thread to one CPU; the default and the
    cap of set_num_threads still count the CPUs the process may use."""
    if torch_first:
        pytest.importorskip("torch")
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: nothing to tell apart")
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    expected = min(int(env), cpus) if env.isdigit() and int(env) > 0 else cpus
    r = run_python(THREADS.format(pre="import torch\n" if torch_first else ""), OMP_PROC_BIND=bind)
    assert r.returncode == 0, r.stderr
    default, capped, pinned = map(int, r.stdout.split())
    assert (default, capped) == (expected, cpus), f"main thread sees {pinned} CPU(s)"
