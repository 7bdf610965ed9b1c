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


gdn_fork_guard_init()   # a forked child runs every call on its calling thread (threads.c)


cdef int _check_threads(object n, str name) except -1:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return min(int(n), _affinity_count())


def set_num_threads(n):
    """Set how many threads later calls may use (at most the process's CPU affinity);
    ``None`` restores the default.

    The default follows ``OMP_NUM_THREADS`` when set, else the CPUs this process may
    run on. Small calls always run on the calling thread. Raises ValueError for
    anything but a positive integer or None.
    """
    global _num_threads
    _num_threads = _default_num_threads() if n is None else _check_threads(n, "n")


def _set_parallel_min_bytes(nbytes):
    """Calls moving fewer bytes run on the calling thread (benchmarks only); returns the
    previous value."""
    return gdn_set_parallel_min_bytes(int(nbytes))


def get_num_threads():
    """Threads a call may use: the ``set_num_threads`` value, else the default."""
    return _num_threads


# ------------------------------------------------------------------------ ISA

def cpu_features():
    """Dict of the CPU features gdnconv detects: x86 (cpuid + xgetbv) and aarch64
    (``asimd``, ``sve``); those of other architectures are False.

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
