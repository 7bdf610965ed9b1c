"""The benchmark scripts in benchmarks/ (outside the package): the engine-like rotation,
what they say when there is nothing to run, and the contention benchmark's busy loop,
which must stop by itself. Nothing here is timed."""
import os
import pathlib
import re
import sys
import time

import numpy as np
import pytest

import gdnconv
from conftest import run_python
from gdnconv.timing import last_level_cache_bytes

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the busy loop pins itself (Linux)")


def test_last_level_cache_from_sysfs():
    llc = last_level_cache_bytes()
    sizes = []
    for d in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        if (d / "type").read_text().strip() != "Instruction":
            sizes.append((d / "size").read_text().strip())
    if not sizes:
        pytest.skip("no cache sizes in sysfs here")
    assert llc == max(int(s.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1) for s in sizes)


def test_rotation_holds_factor_times_the_cache():
    cold = harness.Rotation(factor=4.0)
    for layer_bytes in (1 << 10, 200_000, cold.llc, 10 * cold.llc):
        n = cold.layers(layer_bytes)
        assert n >= 2 and n * layer_bytes >= 4.0 * cold.llc
        assert n == 2 or (n - 1) * layer_bytes < 4.0 * cold.llc
    assert harness.Rotation(warm=True).layers(1) == 1


def test_cycle_shares_turns_between_peers():
    seen = []
    turn = iter([0, 1, 2, 0, 1])
    a = harness.cycle([lambda i=i: seen.append(("a", i)) for i in range(3)], turn)
    b = harness.cycle([lambda i=i: seen.append(("b", i)) for i in range(3)], turn)
    a(), a(), b(), a(), b()
    assert seen == [("a", 0), ("a", 1), ("b", 2), ("a", 0), ("b", 1)]


def test_bench_with_nothing_to_run_exits_nonzero():
    """Only bf16 asked for, without ml_dtypes: a message and a non-zero exit."""
    code = (f"import sys; sys.modules['ml_dtypes'] = None; sys.path.insert(0, {str(BENCH)!r}); import bench; "
            f"sys.exit(bench.main(['--dtype', 'bf16', '--no-progress', '--csv', '', '--plot', '']))")
    res = run_python(code)
    assert res.returncode != 0
    assert "nothing to run" in res.stderr


def test_bench_prefill_smoke():
    """bench_prefill.py runs end to end on a tiny shape (cold rotation, every gdnconv
    peer, the torch loop and the copy) and prints its table; without vLLM's library it
    says so and times the rest."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_prefill; "
            f"sys.exit(bench_prefill.main(['--D', '64', '--shapes', '2x40', '--repeats', '1', '--sample-ms', '1', "
            f"'--lib', '/nonexistent/_C.abi3.so']))")
    res = run_python(code, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "library not found" in res.stdout and "engine-like cold" in res.stdout
    row = [line for line in res.stdout.splitlines() if line.split()[:2] == ["2", "40"]]
    assert len(row) == 1 and "nan" in row[0]   # vllm's column is empty


def _vllm_lib(op):
    """vLLM's op library ($VLLM_C_LIB) for a test that runs its ``op``, with torch and ml_dtypes;
    skips where it is not set or the CPU lacks AVX512-BF16 (which vLLM's native ops need)."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    lib = os.environ.get("VLLM_C_LIB")
    if not lib or not os.path.exists(lib):
        pytest.skip("vLLM's op library not found: set VLLM_C_LIB (see benchmarks/bench_vllm.py)")
    if not gdnconv.cpu_features().get("avx512_bf16"):
        pytest.skip(f"CPU lacks avx512_bf16, which vLLM's {op} needs")
    return lib


def test_bench_prefill_checks_vllm_against_the_reference():
    """bench_prefill.py's first step, with vLLM's op library: vLLM's prefill and gdnconv's
    on a small case against the float64 reference (outputs within tolerance, states bit
    for bit); a failed check would leave vLLM's column untimed."""
    lib = _vllm_lib("causal_conv1d_fwd_cpu")
    res = run_python(f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_prefill; "
                     f"sys.exit(bench_prefill.main(['--_check', '--lib', {lib!r}]))", timeout=300)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    m = re.search(r"max error vLLM ([0-9.]+), gdnconv ([0-9.]+) x tolerance", line)
    assert m and max(float(v) for v in m.groups()) <= 1 and line.endswith("vLLM True, gdnconv True"), line


def test_bench_prefix_smoke():
    """bench_prefix.py (prefix caching's extra work against a copy of its extra bytes) runs end
    to end on a tiny shape and prints its row."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_prefix; "
            f"sys.exit(bench_prefix.main(['--D', '64', '--shapes', '2x40x16', '--repeats', '1', '--sample-ms', '1', "
            f"'--warm']))")
    res = run_python(code, timeout=300)
    assert res.returncode == 0, res.stderr
    row = [line.split() for line in res.stdout.splitlines() if line.split()[:3] == ["2", "40", "16"]]
    assert len(row) == 1 and row[0][3] == "4"     # 2 requests x 2 boundaries (after 8 computed: 8, 24)


def test_bench_vllm_vec_without_the_library_says_where_to_get_it():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_vllm_vec; "
            f"sys.exit(bench_vllm_vec.main(['--lib', '/nonexistent/_C_AVX512.abi3.so']))")
    res = run_python(code)
    assert res.returncode != 0
    assert "library not found (/nonexistent/_C_AVX512.abi3.so)" in res.stderr and "--help" in res.stderr


def _gone(pid):
    """The process has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@linux_only
def test_busy_loop_stops_at_its_deadline():
    import bench_contention
    proc = bench_contention.start_busy(max(os.sched_getaffinity(0)), 0.3)
    assert proc.wait(timeout=60) == 0


@linux_only
def test_busy_loop_stops_when_its_parent_dies():
    """A parent that dies without stopping it (killed benchmark): the loop exits anyway."""
    code = (f"import os, sys; sys.path.insert(0, {str(BENCH)!r}); import bench_contention; "
            f"p = bench_contention.start_busy(max(os.sched_getaffinity(0)), 600); print(p.pid); os._exit(0)")
    res = run_python(code)
    pid = int(res.stdout.split()[-1])
    deadline = time.monotonic() + 60
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = _gone(pid)
    if not gone:
        os.kill(pid, 9)
    assert gone, "the busy loop outlived its parent"


@linux_only
def test_contention_benchmark_short_run(capsys):
    import bench_contention
    assert bench_contention.main(["--batch", "2", "--dim", "512", "--repeats", "1", "--samples", "1",
                                  "--sample-ms", "2", "--settle", "0.05", "--warm"]) == 0
    out = capsys.readouterr().out
    assert "idle: default" in out and "contention: default" in out


@pytest.mark.parametrize("threads", [None, 1])
def test_bench_default_threads_stay_default_calls(monkeypatch, capsys, threads):
    """Without --threads, bench.py times gdnconv's default calls (whose team shrinks while
    they stall) and so never sets a thread count; --threads N sets N, then the default."""
    import bench

    import gdnconv
    asked = []
    real = gdnconv.set_num_threads
    monkeypatch.setattr(gdnconv, "set_num_threads", lambda n: (asked.append(n), real(n))[1])
    argv = ["--batch", "1", "--dim", "64", "--tokens", "1", "--dtype", "fp32", "--isa", gdnconv.active_isa(),
            "--repeats", "1", "--min-repeats", "1", "--sample-us", "10", "--no-torch", "--no-check", "--warm",
            "--no-progress", "--csv", "", "--plot", ""]
    assert bench.main(argv + ([] if threads is None else ["--threads", str(threads)])) == 0
    assert asked == ([] if threads is None else [threads, None])
    assert "threads: " in capsys.readouterr().out


def test_rotation_of_fixed_layers_is_capped_by_memory():
    fixed = harness.Rotation(fixed=32, max_bytes=100 << 20)
    assert fixed.layers(1 << 20) == 32                  # 32 MiB of layers: all 32
    assert fixed.layers(10 << 20) == 10                 # 320 MiB: as many as fit in 100 MiB
    assert fixed.layers(1 << 30) == 2                   # never fewer than 2
    assert harness.Rotation(warm=True, fixed=32).layers(1) == 1
    assert "32 layers" in fixed.describe()
    with pytest.raises(SystemExit, match="--layers"):
        harness.Rotation(fixed=-1)


def test_bench_grid_without_the_library_says_where_to_get_it():
    pytest.importorskip("torch")   # bench_grid loads vLLM's library through torch
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_grid; "
            f"sys.exit(bench_grid.main(['--lib', '/nonexistent/_C.abi3.so']))")
    res = run_python(code)
    assert res.returncode != 0
    assert "library not found (/nonexistent/_C.abi3.so)" in res.stderr


def test_bench_grid_without_vllm_times_gdnconv_against_the_copy(capsys, tmp_path):
    """--without-vllm (a CPU without AVX512-BF16): the grid runs without vLLM's library, its
    table and summary hold the copy ratios only, and every row has them; with two threads
    also the two-thread copy and the ratios to the better copy."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    import bench_grid
    assert bench_grid.main(["--without-vllm", "--lib", "/nonexistent/_C.abi3.so", "--modes", "plain", "prefill",
                            "--dims", "64", "--batch", "4", "--prefill", "1x16", "--rounds", "1", "--threads", "2",
                            "--sample-us", "10", "--wait-quiet", "0", "--warm", "--csv", str(tmp_path / "g.csv")]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.split()[:2] == ["mode", "D"])
    assert head.split() == ["mode", "D", "shape", "MB", "layers", "np", "vllm.py", "plugin", "copy", "copyN",
                            "np/copy", "py/copy", "pl/copy", "np/best", "pl/best", "iqr%", "other%"]
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["plain", "64"], ["prefill", "64"])]
    assert [r[:3] for r in rows] == [["plain", "64", "B=4"], ["prefill", "64", "1x16"]]
    assert all(len(r) == len(head.split()) and all(float(v) > 0 for v in r[5:15]) for r in rows)
    import csv
    with open(tmp_path / "g.csv") as f:
        for r in csv.DictReader(f):   # the better copy's ratio: np over the faster of the two copies' medians
            best = min(float(r["copy_us"]), float(r["copyN_us"]))
            assert float(r["np_best"]) == pytest.approx(float(r["np_us"]) / best, rel=2e-3)
            assert float(r["pl_best"]) == pytest.approx(float(r["plugin_us"]) / best, rel=2e-3)
    assert "np / copy, decode B >= 4" in out and "plugin / copy, decode B >= 4" in out
    assert "np / best copy, decode B >= 4" in out and "np / best copy, prefill" in out
    assert "np / copy, prefill" in out and "vLLM, every case" not in out


def test_bench_grid_vllm_weights_as_parameters(capsys):
    """--vllm-weights parameter: the peers that get vLLM's weight objects (plugin, vllm.py; vLLM
    where it runs) get them as vLLM's engine holds them, a Parameter subclass with a Python
    __torch_function__, and every decode row is timed."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    import bench_grid
    import bench_vllm
    import harness
    p = bench_vllm.Peer(torch, None, np.random.default_rng(0), 2, 1, 64, 3, vllm_weights="parameter")
    assert type(p.wtv) is type(harness.vllm_weight(p.wt)) and isinstance(p.wtv, torch.nn.Parameter)
    assert type(p.wtv).__torch_function__ is not torch.nn.Parameter.__torch_function__
    assert bench_grid.main(["--without-vllm", "--lib", "/nonexistent/_C.abi3.so", "--modes", "plain", "spec",
                            "--dims", "64", "--batch", "4", "--rounds", "1", "--sample-us", "10", "--wait-quiet", "0",
                            "--vllm-weights", "parameter", "--vllm-spec", "step", "--csv", ""]) == 0
    out = capsys.readouterr().out
    assert "vLLM's weight objects parameter, vLLM's spec step" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["plain", "64"], ["spec", "64"])]
    assert [r[:3] for r in rows] == [["plain", "64", "B=4"], ["spec", "64", "B=4"]]
    assert all(float(v) > 0 for r in rows for v in r[5:8])


def test_bench_grid_no_out_cache_turns_the_reuse_off(capsys):
    """--no-out-cache times new outs from malloc (the behaviour before the out cache): the
    limit is 0 while the grid runs and the header says so."""
    pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    import bench_grid
    previous = gdnconv.set_out_cache_bytes(256 << 20)
    try:
        assert bench_grid.main(["--without-vllm", "--modes", "plain", "--dims", "64", "--batch", "4", "--rounds", "1",
                                "--sample-us", "10", "--wait-quiet", "0", "--warm", "--csv", "",
                                "--no-out-cache"]) == 0
        assert gdnconv.set_out_cache_bytes(previous) == 0
    finally:
        gdnconv.set_out_cache_bytes(previous)
    assert "; out cache off" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("n, threads", [(1000, 2), (1000, 3), (10, 4), (4096, 16)])
def test_parallel_copy_copies_every_element(n, threads):
    """The many-thread copy yardstick moves every element of its source, whatever the
    split (a short last part, fewer parts than threads where the array is small)."""
    src = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    dst = np.zeros_like(src)
    harness.parallel_copy(dst, src, threads)()
    np.testing.assert_array_equal(dst, src)
    assert harness.copy_same_bytes(n, layers=2, threads=threads)() is None
    rows = np.zeros((2, n), np.float32)   # 2-D: cut in the flat memory, not in rows
    harness.parallel_copy(rows, np.stack([src, -src]), threads)()
    np.testing.assert_array_equal(rows, np.stack([src, -src]))
    with pytest.raises(ValueError, match="C-contiguous"):
        harness.parallel_copy(rows.T, np.stack([src, -src]).T.copy(), threads)


@pytest.mark.parametrize("weight", ["plain", "subclass"])
def test_bench_op_times_every_path_in_every_regime(weight, capsys):
    """bench_op.py: a row per regime, case and route (with T = 4 also the plugin's speculative
    conv), each with the direct call's, the torch
    op's and the Cython path's medians (positive) and the two ratios; the routes' default
    (gdnconv.vllm._op_new) restored after."""
    torch = pytest.importorskip("torch")
    import gdnconv.vllm as gv
    if gv._op_new is None:
        pytest.skip("no torch op here (not Linux, or a torch without the stable ABI's functions)")
    import bench_op
    threads = torch.get_num_threads()
    default = gv._op_new
    try:
        bench_op.main(["--dims", "64", "--batch", "1", "--rounds", "1", "--calls", "5", "--weight", weight])
    finally:
        torch.set_num_threads(threads)
        gdnconv.set_num_threads(None)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["grad"], ["no_grad"], ["inference"])]
    assert [(r[0], r[3], " ".join(r[4:7])) for r in rows] == [
        (g, t, route) for g in ("grad", "no_grad", "inference") for t in ("1", "4")
        for route in ("vllm.py, out given", "plugin, new out") + (("plugin, spec varlen",) if t == "4" else ())]
    assert all(len(r) == 12 and float(v) > 0 for r in rows for v in r[-5:])
    assert gv._op_new is default


def test_the_grids_speculative_steps_compute_the_step():
    """bench_grid's spec peers as the engines run them (plugin: the plugin's _spec_forward conv on
    the step's metadata; vLLM with --vllm-spec step: vLLM 0.32's checks and conversions, then its
    op): on the same step both give the float64 reference's outputs and its state bit for bit, so
    neither times a call that skips work."""
    lib = _vllm_lib("causal_conv1d_update_cpu")
    import torch
    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("CPU lacks AMX, without which vLLM's speculative step runs a torch loop, not its op")
    import bench_vllm
    from conftest import reference
    from gdnconv.testing import assert_outputs_close
    _, ops = bench_vllm._load(lib)
    B, T, D = 3, 4, 64
    p = bench_vllm.Peer(torch, ops, np.random.default_rng(5), B, T, D, bench_vllm.W_VLLM - 2 + T, S=8,
                        weight="packed")
    before = p.state.copy()
    ref_out, ref_state, mag = reference(p.x, before, p.w, None, activation="silu", num_accepted_tokens=p.na,
                                        conv_state_indices=p.idx)
    with torch.inference_mode():
        for step in (p.plugin(packed=True), p.vllm(spec_step=True)):
            p.state[...] = before
            out = step()
            assert tuple(out.shape) == (B * T, D)
            assert_outputs_close(out.reshape(B, T, D), ref_out, mag, silu=True)
            assert np.array_equal(p.state.view(np.uint16), np.asarray(ref_state).view(np.uint16))
