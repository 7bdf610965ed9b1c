# The runtime: thread settings, CPU features and ISA selection (the C side's
# isa.c, cpu_features.c and threads.c).

# ------------------------------------------------------------------ threads

def _affinity_count():
    """CPUs this process may use. The OpenMP runtime's count where the build has one:
    with OMP_PROC_BIND set, libgomp pins the calling thread to one CPU, and that
    thread's own mask (sched_getaffinity) would then say 1."""
    n = gdn_num_procs()
    if n > 0:
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_num_threads():
    n = _affinity_count()
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return min(int(env), n)
    return n


cdef int _num_threads = _default_num_threads()
cdef bint _threads_set = False   # set_num_threads(n): every call uses n, never fewer


gdn_fork_guard_init()   # a forked child runs every call on its calling thread (threads.c)


cdef int _check_threads(object n, str name) except -1:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    if n == 1:   # nothing to cap: skips the affinity query (a system call, ~1.2 us a call)
        return 1
    return min(int(n), _affinity_count())


cdef int _call_threads(object num_threads) except 0:
    """The thread request gdn_update_run takes: n > 0 exactly (num_threads= or
    set_num_threads), -n for a default call that may use up to n (threads.c)."""
    if num_threads is not None:
        return _check_threads(num_threads, "num_threads")
    return _num_threads if _threads_set else -_num_threads


def set_num_threads(n):
    """Set how many threads every later call uses (at most the process's CPU
    affinity); ``None`` restores the default.

    The default follows ``OMP_NUM_THREADS`` when set, else the CPUs this process may
    run on, and uses fewer while calls on several threads wait for a thread the
    scheduler parked (``thread_contention()``); a number set here is used as it is,
    like ``num_threads=``. Small calls always run on the calling thread. Raises
    ValueError for anything but a positive integer or None.
    """
    global _num_threads, _threads_set
    _num_threads = _default_num_threads() if n is None else _check_threads(n, "n")
    _threads_set = n is not None
    gdn_torch_op_threads(_call_threads(None))


def thread_contention():
    """How default calls from the calling thread share the CPUs now (a dict).

    A call without ``num_threads=`` (and no ``set_num_threads(n)``) times its team
    against the calling thread's own share; when two of four such calls were slower
    than one thread would have been (a thread waited for the scheduler), later calls
    of this thread use half the team, and after a backoff of 10 ms to 1 s one call
    tries the larger team again. Keys: ``threads`` (the most a default call of this
    thread uses now), ``last_call_threads`` (the team of this thread's last call,
    explicit or not), ``slow_calls``, ``reductions``, ``probes`` and ``capped_calls``
    (default calls that ran on fewer threads than they would have without the cap;
    counts since the thread's first call), ``retry_in_s`` (seconds until the next try
    of a larger team, 0 when none is pending).
    """
    cdef gdn_adapt_state s = gdn_adapt_get()
    cdef int limit = _num_threads
    reduced = s.cap != GDN_NO_CAP and s.cap < limit
    return {"threads": s.cap if reduced else limit, "last_call_threads": s.last_threads,
            "slow_calls": s.slow_calls, "reductions": s.reductions, "probes": s.probes,
            "capped_calls": s.capped_calls,
            "retry_in_s": max(0.0, s.retry_at - gdn_adapt_now()) if reduced else 0.0}


def _hold_threads(cap, seconds):
    """Tests and benchmarks: default calls of the calling thread use at most ``cap``
    threads for ``seconds`` (then probe as after a slowdown); ``cap=None`` resets the
    thread's adaptive state (full team, no history, shortest backoff)."""
    cdef gdn_adapt_state s = gdn_adapt_get()
    if cap is None:
        s.cap, s.history, s.retry_at, s.backoff = GDN_NO_CAP, 0, 0.0, 0.01
        s.slow_calls = s.probes = s.reductions = s.capped_calls = 0
    else:
        s.cap, s.history, s.retry_at = int(cap), 0, gdn_adapt_now() + float(seconds)
    gdn_adapt_set(s)


def _adapt_step(n, slow, now):
    """Tests: one default call of up to ``n`` threads at time ``now`` (seconds on the
    state's clock), recorded as ``slow`` if it gets a team; returns its team size.
    Nothing runs: this drives the calling thread's state machine alone."""
    return gdn_adapt_step(int(n), 1 if slow else 0, float(now))


def _set_parallel_min_bytes(nbytes):
    """Calls moving fewer bytes run on the calling thread (benchmarks only); returns the
    previous value."""
    return gdn_set_parallel_min_bytes(int(nbytes))


def get_num_threads():
    """Threads a call may use: the ``set_num_threads`` value, else the default (the
    most a default call uses; ``thread_contention()`` says how many it uses now)."""
    return _num_threads


# ------------------------------------------------------------------------ reused outs

def _torch_op_init(libtorch_path):
    """Register gdnconv's decode as torch ops (``torch.ops._gdnconv.update_new`` and
    ``update_into``, src/csrc/torch_op.c) on torch's stable C ABI, its functions looked
    up in the loaded libtorch at ``libtorch_path`` (str); for gdnconv.vllm, which has
    imported torch. Returns 0 when they are registered (now or before), a negative
    code when this torch or platform cannot have them."""
    rc = gdn_torch_op_init(os.fsencode(libtorch_path))
    gdn_torch_op_threads(_call_threads(None))
    return rc


def _torch_direct_init(libtorch_python_path):
    """Make the ops' call without torch's dispatcher (``_direct_new`` / ``_direct_into``,
    src/csrc/torch_op.c) where this torch's Python objects hold their tensors where
    torch 2.13's do, checked on a tensor of its own; after ``_torch_op_init``.
    ``libtorch_python_path``: the loaded libtorch_python. Returns 0 when the calls are
    possible, a negative code when not."""
    cdef void *probe = NULL
    rc = gdn_torch_direct_init(os.fsencode(libtorch_python_path), sizeof(PyObject), &probe)
    if probe == NULL:
        PyErr_Clear()   # (a failed wrap's error, if any: no direct calls then)
    Py_XDECREF(<PyObject *>probe)
    return rc


cdef inline bint _exact(object t):
    return type(t) is _tensor_type or type(t) is _parameter_type


cdef dict _in_place_types = {}


cdef bint _read_in_place(object t):
    """A weight or bias the op's call reads: a torch.Tensor, an nn.Parameter, or a subclass of
    nn.Parameter without its own ``__torch_dispatch__`` (vLLM's ModelWeightParameter), whose
    tensor is read with none of its Python functions run, as gdnconv.vllm._plain reads it (the
    direct call reads it in C; the torch op is called with subclass functions off); decided
    once per type."""
    if _exact(t):
        return True
    tp = type(t)
    known = _in_place_types.get(tp)
    if known is None:
        known = _in_place_types[tp] = (issubclass(tp, _parameter_type) and
                                       getattr(tp, "__torch_dispatch__", None) is _tensor_type.__torch_dispatch__)
    return known


cdef bint _plain_flag(object t, bint neg) except -1:
    """t.is_neg() (neg) or t.requires_grad, a Parameter subclass's with its Python functions
    off (as _plain reads it)."""
    if _exact(t):
        return t.is_neg() if neg else t.requires_grad
    with _torch._C.DisableTorchFunctionSubclass():
        return t.is_neg() if neg else t.requires_grad


cdef object _direct(tuple args, int64_t flags, int64_t pad_slot_id):
    """The ops' call without the dispatcher on args (x, conv_state, weight, bias,
    num_accepted_tokens, conv_state_indices, query_start_loc[, out]: torch.Tensors, the
    weight and bias _read_in_place; an absent one's place holding x) after the caller's
    checks: what the dispatcher did for the op, it does itself: an input with a negation
    bit (x, weight, bias, the index arrays) is refused (its memory holds the values
    negated; the Cython path refuses or resolves it). Returns the new out (no out given)
    or True when the kernel ran, None when refused, nothing written."""
    cdef void *objs[8]
    cdef void *made = NULL
    cdef int i, done, into = len(args) == 8
    for i in range(len(args)):
        objs[i] = <void *>args[i]
    if (args[0].is_neg() or _plain_flag(args[2], True) or (flags & GDN_OP_BIAS and _plain_flag(args[3], True))
            or (flags & GDN_OP_ACCEPTED and args[4].is_neg()) or (flags & GDN_OP_INDICES and args[5].is_neg())
            or (flags & GDN_OP_VARLEN and args[6].is_neg())):
        return None
    with nogil:
        done = gdn_torch_direct(objs, into, flags, pad_slot_id, &made)
    if not done:
        return None
    return True if into else gdn_torch_wrap(made)


cdef bint _direct_types(tuple args):
    """Every argument a torch.Tensor, the weight and bias also _read_in_place."""
    cdef int i
    if not _is_tensor(args[0]):    # (which also looks torch.Tensor up, once)
        return False
    for i in range(len(args)):
        if type(args[i]) is not _tensor_type and not ((i == 2 or i == 3) and _read_in_place(args[i])):
            return False
    return True


def _direct_new(x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc,
                int64_t flags, int64_t pad_slot_id):
    """``torch.ops._gdnconv.update_new``'s call without the dispatcher: its arguments, its
    result (a new tensor, or None where it does not take the call, nothing written), for
    torch.Tensors (the weight and bias also Parameters). The caller's checks are the op's
    (``_op_update``, which makes this call inline)."""
    args = (x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc)
    return _direct(args, flags, pad_slot_id) if _direct_types(args) else None


cdef object _direct_new_call = _direct_new    # (_op_update makes this call inline)


def _direct_into(x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc, out,
                 int64_t flags, int64_t pad_slot_id):
    """``torch.ops._gdnconv.update_into``'s call without the dispatcher: 1 when ``out`` (and
    ``conv_state``) were written, 0 when it does not take the call (nothing written)."""
    args = (x, conv_state, weight, bias, num_accepted_tokens, conv_state_indices, query_start_loc, out)
    return 1 if _direct_types(args) and _direct(args, flags, pad_slot_id) is not None else 0


cdef inline bint _op_writable(object t, bint inside):
    """A tensor the op may write: exactly a torch.Tensor, no grad required, no negation bit,
    not an inference tensor outside inference mode (what torch's stable ABI cannot read)."""
    return (type(t) is _tensor_type and not t.requires_grad and not t.is_neg()
            and (inside or not t.is_inference()))


def _op_update(op_new, op_into, x, conv_state, weight, bias, activation, num_accepted_tokens, conv_state_indices,
               pad_slot_id, out, int flags, query_start_loc=None):
    """gdnconv.vllm's usual decode call (varlen with ``query_start_loc``, an int32 tensor) through
    the ops' call ``op_new`` / ``op_into`` (``_direct_new`` / ``_direct_into``, without torch's
    dispatcher, made inline here; or
    the torch ops ``torch.ops._gdnconv.update_new`` / ``update_into``; src/csrc/torch_op.c;
    None: neither here): ``out`` None (into a new tensor, which it returns) or given,
    ``flags`` the GDN_OP_* of the call's layout (tokens last, packed weight, skipped rows
    from x). Returns the result, or None where the call is not taken, before anything is
    written: no op; an argument not a plain torch.Tensor or None (a weight or bias may be
    an nn.Parameter or a Parameter subclass without its own ``__torch_dispatch__``, whose
    tensor is read with none of its Python functions run: ``_read_in_place``); a written
    tensor (conv_state, out) that requires grad, carries a negation bit or is an inference
    tensor outside inference mode; an activation or pad_slot_id of another type; in grad mode, a given out (there
    the dispatcher's autograd fallback costs what the torch op saves) or an input that
    requires grad (the torch op's output would get an autograd history the core's own call
    does not give); or whatever the call refuses. An input with a pending negation bit (x,
    weight, bias), or a zero tensor (torch._efficientzerotensor) weight or bias, torch's
    dispatcher makes plain before the torch op runs, so that op computes on its values,
    where the direct call and the Cython intake refuse such a tensor (asking for
    resolve_neg(), or as memoryless). Under inference mode the torch op takes 1.0-2.3
    us less a call with a new out (the plugin's) than the core's Cython intake at one to
    four requests, about even with a given out (benchmarks/bench_op.py); these checks in
    Cython rather than Python, 0.2-0.45 us less (benchmarks/README.md, stop 53); the
    direct call 1.6-2.1 us less than the torch op (stop 55)."""
    if op_new is None or not _is_tensor(x):
        return None
    if (type(x) is not _tensor_type or type(conv_state) is not _tensor_type or type(pad_slot_id) is not int
            or not _read_in_place(weight)):
        return None
    cdef bint grad = _grad_enabled()
    if grad and out is not None:     # (asked first: the checks below cost what the op would save)
        return None
    if activation is True or (type(activation) is str and (activation == "silu" or activation == "swish")):
        flags |= GDN_OP_SILU
    elif activation is not None and activation is not False:
        return None
    cdef bint inside = _inference_mode()    # (inside inference mode any tensor may be written)
    if not _op_writable(conv_state, inside):
        return None
    if out is not None and not _op_writable(out, inside):   # (out is x: x too)
        return None
    # an absent bias, num_accepted_tokens, conv_state_indices or query_start_loc: x in its place,
    # its flag unset
    b, nat, idx, qsl = x, x, x, x
    if bias is not None:
        b = bias
        flags |= GDN_OP_BIAS
        if not _read_in_place(b):
            return None
    if num_accepted_tokens is not None:
        nat = num_accepted_tokens
        flags |= GDN_OP_ACCEPTED
        if type(nat) is not _tensor_type:
            return None
    if conv_state_indices is not None:
        idx = conv_state_indices
        flags |= GDN_OP_INDICES
        if type(idx) is not _tensor_type:
            return None
    if query_start_loc is not None:
        qsl = query_start_loc
        flags |= GDN_OP_VARLEN
        if type(qsl) is not _tensor_type:
            return None
    if grad and (x.requires_grad or _plain_flag(weight, False) or _plain_flag(b, False)):
        return None
    if op_new is _direct_new_call:    # (made inline)
        done = _direct((x, conv_state, weight, b, nat, idx, qsl) if out is None else
                       (x, conv_state, weight, b, nat, idx, qsl, out), flags, pad_slot_id)
    else:
        try:    # (the dispatcher refuses a meta or other device's tensor, before the kernel runs)
            if _exact(weight) and _exact(b):
                done = _dispatched(op_new, op_into, (x, conv_state, weight, b, nat, idx, qsl), out, flags, pad_slot_id)
            else:   # a Parameter subclass's tensor, its Python functions off, as _plain reads it
                with _torch._C.DisableTorchFunctionSubclass():
                    done = _dispatched(op_new, op_into, (x, conv_state, weight, b, nat, idx, qsl), out, flags,
                                       pad_slot_id)
        except Exception:
            done = None
    if _op_log is not None:
        _op_log.append(done is not None)
    return done if out is None or done is None else out


cdef object _dispatched(op_new, op_into, tuple args, out, int flags, object pad_slot_id):
    """The torch op's call: its new out, or True (out given and written), or None."""
    if out is None:
        return op_new(*args, flags, pad_slot_id)
    return True if op_into(*args, out, flags, pad_slot_id) else None


cdef object _op_log = None


def _log_op_calls(log):
    """From now on each call ``_op_update`` makes (direct or through the torch ops) appends
    whether it was taken to ``log`` (anything with ``append``); None stops it. For tests
    and the engine driver (tests/vllm_engine.py). Returns the previous log."""
    global _op_log
    previous, _op_log = _op_log, log
    return previous


def set_out_cache_bytes(nbytes):
    """Set how many bytes of freed large outputs gdnconv keeps for reuse (default 256
    MiB); returns the previous limit. ``0`` turns reuse off and releases what is kept.

    A call that makes its own ``out`` (no ``out=``) of 4 MiB or more (a prefill of 256
    tokens at D = 8192 in bf16, say) takes its memory from this cache when a kept block
    fits (one no more than twice the size: the out then holds that block), else maps a
    new block; when the returned array or tensor and every view of it are freed, the
    block is kept for the next such call, up to this limit and 8 blocks (the oldest are
    released first), instead of going back to the OS. Why: glibc's malloc, under NumPy
    and torch alike, hands a freed block over its mmap threshold (32 MiB at most) back
    to the OS, and torch's aligned requests of a repeated size can land above it every
    time, so such an output is mapped afresh and the kernel's first stores wait for the
    OS to zero each page (on the 2-core Xeon: a D=8192 4x1024 prefill on two threads, 16.2 ms
    into a new out against 6.1 ms into a given one; a new 8 MiB torch out in a fresh
    process, 3-15 ms a call against 0.8 ms for the NumPy call).

    Such an out is a view of gdnconv's block: a NumPy array does not own its data
    (``ndarray.resize`` refuses it; ``tracemalloc`` does not see it), a tensor is made
    by ``torch.from_numpy`` (its storage cannot be resized, as with any tensor over
    NumPy memory); a tensor subclass ``x`` still gets ``torch.empty_like``'s out. Linux
    only (elsewhere outputs are allocated as usual). Raises ValueError for anything but
    an integer >= 0.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0 (bytes; 0 turns the reuse off), "
                         f"got {nbytes!r}")
    return gdn_block_cache_limit(min(int(nbytes), (1 << 62)))


def out_cache_bytes():
    """Bytes of freed large outputs kept for reuse now, in blocks no array uses (the
    limit is what ``set_out_cache_bytes`` returns; see there)."""
    return gdn_block_cache_held()


# ------------------------------------------------------------------------ ISA

def cpu_features():
    """Dict of the CPU features gdnconv detects: x86 (cpuid + xgetbv) and aarch64
    (``asimd``, ``sve``, ``bf16``: getauxval on Linux); those of other architectures are False.

    ``os_avx``/``os_avx512``/``os_amx`` say whether the OS saves that register state
    (XCR0), without which the instructions cannot be used.
    """
    return {gdn_feature_name(i).decode(): bool(gdn_cpu_has(i)) for i in range(GDN_FEATURE_COUNT)}


def compiled_isas():
    """Kernel names compiled into this build, best first (``scalar`` is always last)."""
    return [gdn_isa_name(i).decode() for i in range(gdn_isa_count())]


def available_isas():
    """Kernel names this build has and this CPU supports, best first."""
    return [gdn_isa_name(i).decode() for i in range(gdn_isa_count()) if gdn_isa_supported(i)]


def active_isa():
    """Name of the kernel calls use now (``GDNCONV_ISA`` or the best available)."""
    return gdn_active_isa().decode()


def set_isa(name=None):
    """Use kernel ``name`` (None or "": the best available) for later calls; returns the previous name.

    Raises ValueError when ``name`` is unknown or this CPU (or build) lacks it.
    """
    previous = active_isa()
    rc = gdn_select_isa(NULL) if name is None or name == "" else gdn_select_isa(str(name).encode())
    if rc == -1:
        raise ValueError(f"unknown ISA {name!r}: this build knows {compiled_isas()}")
    if rc == -2:
        raise ValueError(f"ISA {name!r} is not supported by this CPU: available are {available_isas()}")
    return previous
