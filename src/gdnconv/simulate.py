"""Speculative-decoding simulator: an MTP decode loop through gdnconv, every output checked.

A fixed-size batch of request positions (CUDA-graph style) runs decode steps against a
pool of conv-state slots. Each step every live request feeds its last verified token plus
0..--drafts draft tokens (one varlen call with query_start_loc); each draft is accepted
with probability --accept-rate while the previous ones were, and the count accepted is
the next step's num_accepted_tokens. Requests finish and new ones join: a freed slot is
zeroed and reused, and an empty batch position is passed with pad_slot_id. With
--prompt-len P (default 128) a joining request first prefills a prompt of 1..P tokens (one varlen
conv_prefill call per step for all joiners; the slot is not zeroed and
has_initial_state is false, so its stale content must not be read).

Only the conv_update_multi and conv_prefill calls are timed, separately (decode and
prefill tokens/s). With --check (the default) every output of
every step, prompt outputs included, is compared with a float64 reference computed
from each request's own prompt and accepted-token history (never from the kernel's state), in units of the accepted
tolerance (gdnconv.testing); the exit status is nonzero when any output is out of
tolerance. When torch is installed, the same steps (same inputs) are replayed through
the per-request torch loop that serving engines run without a native kernel
(gdnconv.reference.torch_loop_update; prompts through torch_loop_prefill), under the same conditions: its outputs are
checked between its steps too, so both sides find their data pushed out of the
caches by the check, as the other layers of a model would push it out. The CPU time
other processes take meanwhile is measured; a busy machine is reported.
"""
import argparse
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

import gdnconv
from gdnconv.reference import torch_loop_prefill, torch_loop_update
from gdnconv.testing import as_torch
from gdnconv.timing import BUSY_PCT, CpuMeter

from ._sim_report import finite_json, format_report
from ._sim_workload import PAD_SLOT_ID, Checker, build_schedule, make_model

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


@dataclass(frozen=True)
class Preset:
    """A model shape: conv channels per rank, kernel width, default step count."""
    dim: int
    width: int
    steps: int
    about: str


PRESETS = {
    "qwen3-next": Preset(8192, 4, 1500, "Qwen3-Next-80B-A3B linear-attention conv (D=8192, W=4)"),
    "qwen3.5-27b": Preset(10240, 4, 1200, "Qwen3.5-27B linear-attention conv (D=10240, W=4)"),
    "tiny": Preset(64, 4, 120, "a tiny shape for quick checks and tests (D=64, W=4)"),
}

DTYPES = ("bfloat16", "float16", "float32")


def numpy_dtype(name):
    """NumPy dtype for a --dtype name (bfloat16 is ml_dtypes.bfloat16)."""
    if name == "bfloat16":
        if ml_dtypes is None:
            raise SystemExit('gdnconv simulate: bfloat16 needs the ml_dtypes package: pip install ml_dtypes '
                             '(from a gdnconv checkout: pip install ".[sim]"), or run with --dtype float32')
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ---------------------------------------------------------------------------- running

def _progress(total, desc, enabled):
    """A tqdm bar on stderr when tqdm is installed and enabled (off when not a tty)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False,
                disable=None if enabled else True)


def _stats(ns, tokens):
    """Throughput and latency summary for per-step times ``ns`` and live-token counts."""
    ns = np.asarray(ns, dtype=np.float64)
    total_s = ns.sum() * 1e-9
    return {
        "steps": int(ns.size),
        "tokens": int(np.sum(tokens)),
        "tokens_per_s": float(np.sum(tokens) / total_s) if total_s > 0 else 0.0,
        "median_us": float(np.median(ns) / 1e3),
        "p99_us": float(np.percentile(ns, 99) / 1e3),
        "mean_us": float(ns.mean() / 1e3),
        "total_s": float(total_s),
    }


def _stage(step, state, pool, x_buf, out_buf, sentinel):
    """A step's untimed part: zero the slots it resets, gather its inputs into x_buf,
    fill out_buf with NaN when checking (pad rows must stay NaN); returns its rows."""
    if len(step.resets):
        state[step.resets] = 0
    n = len(step.tokens)
    np.take(pool, step.tokens, axis=0, out=x_buf[:n])
    if sentinel:
        out_buf[:n] = np.nan
    return n


def run_prefill(p, state, weight, bias, pool, threads, checker):
    """A step's prompts (``Prefill`` p) through ``gdnconv.conv_prefill`` (zero history: the
    slots' stale content is not read), then their check; returns (ns, seconds checking)."""
    x = np.take(pool, p.tokens, axis=0)
    out = np.full_like(x, np.nan) if checker is not None else np.empty_like(x)
    t0 = time.perf_counter_ns()
    gdnconv.conv_prefill(x, weight, bias, activation="silu", conv_state=state, query_start_loc=p.query_start_loc,
                         cache_indices=p.slots, has_initial_state=np.zeros(len(p.slots), dtype=bool),
                         pad_slot_id=PAD_SLOT_ID, out=out, num_threads=threads)
    ns = time.perf_counter_ns() - t0
    c0 = time.perf_counter()
    if checker is not None:
        checker.check(-1, p, out)
    return ns, time.perf_counter() - c0


def run_gdnconv(schedule, state, weight, bias, pool, x_buf, out_buf, threads, checker, snapshot_at,
                progress, prefill_checker=None):
    """Run every step through ``gdnconv.conv_update_multi``, after its prompts (if any)
    through ``gdnconv.conv_prefill``, with ``num_threads=threads`` (None: the default);
    returns (ns per step, bytes per step, state snapshot after ``snapshot_at`` steps,
    seconds spent checking, % of a CPU other processes used meanwhile, prefill ns per
    step, prefill tokens per step)."""
    kernel = gdnconv.conv_update_multi
    ns = np.zeros(len(schedule), dtype=np.int64)
    nbytes = np.zeros(len(schedule), dtype=np.int64)
    p_ns = np.zeros(len(schedule), dtype=np.int64)
    p_tokens = np.zeros(len(schedule), dtype=np.int64)
    snapshot = None
    check_s = 0.0
    bar = _progress(len(schedule), "gdnconv", progress)
    meter = CpuMeter()
    m0 = meter.mark()
    for i, step in enumerate(schedule):
        if step.prefill is not None:   # the joiners' prompts, timed on their own
            p_ns[i], spent = run_prefill(step.prefill, state, weight, bias, pool, threads, prefill_checker)
            p_tokens[i] = len(step.prefill.tokens)
            check_s += spent
        # -- untimed: slot resets, inputs, index arrays, output sentinel
        n = _stage(step, state, pool, x_buf, out_buf, checker is not None)
        x, out = x_buf[:n], out_buf[:n]
        nbytes[i] = gdnconv.bytes_moved(x, state, weight, num_accepted_tokens=step.num_accepted,
                                        conv_state_indices=step.slots, query_start_loc=step.query_start_loc,
                                        pad_slot_id=PAD_SLOT_ID)
        # -- timed: the kernel call only
        t0 = time.perf_counter_ns()
        kernel(x, state, weight, bias, activation="silu", num_accepted_tokens=step.num_accepted,
               conv_state_indices=step.slots, query_start_loc=step.query_start_loc,
               pad_slot_id=PAD_SLOT_ID, out=out, num_threads=threads)
        ns[i] = time.perf_counter_ns() - t0
        # -- untimed: verification
        if checker is not None:
            c0 = time.perf_counter()
            checker.check(i, step, out)
            check_s += time.perf_counter() - c0
        if i + 1 == snapshot_at:
            snapshot = state.copy()
        if bar is not None:
            bar.update()
    others = meter.others_pct(m0, meter.mark())
    if bar is not None:
        bar.close()
    return ns, nbytes, snapshot, check_s, others, p_ns, p_tokens


def run_torch(schedule, state_shape, weight, bias, pool, dtype, threads, checker, progress):
    """Replay ``schedule`` (same inputs, slot resets and index arrays) through the
    per-request torch loop on torch tensors, with ``checker`` (if any) run on its outputs
    between steps as for gdnconv; returns (ns per step, final state as NumPy, % of a CPU
    other processes used meanwhile)."""
    import torch

    state = np.zeros(state_shape, dtype=dtype)
    x_buf = np.empty((max(len(s.tokens) for s in schedule) or 1, pool.shape[1]), dtype=dtype)
    out_buf = np.zeros_like(x_buf)
    state_t, x_t, out_t = as_torch(state), as_torch(x_buf), as_torch(out_buf)
    weight_t, bias_t = as_torch(np.ascontiguousarray(weight)), as_torch(np.ascontiguousarray(bias))
    index_t = [(torch.from_numpy(s.num_accepted), torch.from_numpy(s.slots), torch.from_numpy(s.query_start_loc))
               for s in schedule]

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # warm-up on a scratch state: F.conv1d pays one-time setup per token count
        scratch = torch.zeros_like(state_t)
        for i, step in enumerate(schedule[:10]):
            n = len(step.tokens)
            np.take(pool, step.tokens, axis=0, out=x_buf[:n])
            torch_loop_update(x_t[:n], scratch, weight_t, bias_t, activation="silu",
                              num_accepted_tokens=index_t[i][0], conv_state_indices=index_t[i][1],
                              query_start_loc=index_t[i][2], pad_slot_id=PAD_SLOT_ID, out=out_t[:n])
        ns = np.zeros(len(schedule), dtype=np.int64)
        bar = _progress(len(schedule), "torch loop", progress)
        meter = CpuMeter()
        m0 = meter.mark()
        for i, step in enumerate(schedule):
            if step.prefill is not None:   # untimed: the prompts through the torch loop
                p = step.prefill
                torch_loop_prefill(as_torch(np.take(pool, p.tokens, axis=0)), weight_t, bias_t, activation="silu",
                                   conv_state=state_t, query_start_loc=torch.from_numpy(p.query_start_loc),
                                   cache_indices=torch.from_numpy(p.slots), pad_slot_id=PAD_SLOT_ID,
                                   has_initial_state=torch.zeros(len(p.slots), dtype=torch.bool))
            n = _stage(step, state, pool, x_buf, out_buf, checker is not None)
            acc_t, slots_t, qsl_t = index_t[i]
            t0 = time.perf_counter_ns()
            torch_loop_update(x_t[:n], state_t, weight_t, bias_t, activation="silu",
                              num_accepted_tokens=acc_t, conv_state_indices=slots_t,
                              query_start_loc=qsl_t, pad_slot_id=PAD_SLOT_ID, out=out_t[:n])
            ns[i] = time.perf_counter_ns() - t0
            if checker is not None:
                checker.check(i, step, out_buf[:n])
            if bar is not None:
                bar.update()
        others = meter.others_pct(m0, meter.mark())
        if bar is not None:
            bar.close()
    finally:
        torch.set_num_threads(old_threads)
    return ns, state, others


def _warm_up(schedule, state, weight, bias, pool, x_buf, out_buf, threads):
    """A few untimed kernel calls on a scratch copy of the state (thread pool start-up)."""
    scratch = np.zeros_like(state)
    for step in schedule[:3]:
        n = len(step.tokens)
        np.take(pool, step.tokens, axis=0, out=x_buf[:n])
        gdnconv.conv_update_multi(x_buf[:n], scratch, weight, bias, activation="silu",
                                  num_accepted_tokens=step.num_accepted, conv_state_indices=step.slots,
                                  query_start_loc=step.query_start_loc, pad_slot_id=PAD_SLOT_ID,
                                  out=out_buf[:n], num_threads=threads)


def simulate(args):
    """Run the simulation described by parsed ``args``; returns the result dict."""
    preset = PRESETS[args.preset]
    dim = preset.dim if args.dim is None else args.dim
    width = preset.width if args.width is None else args.width
    steps = args.steps if args.steps is not None else preset.steps
    batch, drafts = args.batch, args.drafts
    num_slots = args.slots if args.slots is not None else 2 * batch
    state_len = width - 1 + drafts
    mean_life = args.mean_life if args.mean_life is not None else _mean_life(steps)
    threads = args.threads if args.threads is not None else gdnconv.get_num_threads()
    dtype = numpy_dtype(args.dtype)
    for name, value, ok, rule in (
            ("--dim", dim, dim >= 1, ">= 1"), ("--width", width, 2 <= width <= 8, "in 2..8"),
            ("--batch", batch, batch >= 1, ">= 1"), ("--drafts", drafts, drafts >= 0, ">= 0"),
            ("--steps", steps, steps >= 1, ">= 1"), ("--slots", num_slots, num_slots >= batch, ">= --batch"),
            ("--accept-rate", args.accept_rate, 0.0 <= args.accept_rate <= 1.0, "in 0..1"),
            ("--mean-life", mean_life, mean_life >= 1, ">= 1"), ("--threads", threads, threads >= 1, ">= 1"),
            ("--prompt-len", args.prompt_len, args.prompt_len >= 0, ">= 0")):
        if not ok:
            raise SystemExit(f"gdnconv simulate: {name} {value} must be {rule}")

    t_start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    # ~32 MiB of float64 token pool (at least 256 tokens, at most 4096)
    pool_size = int(min(4096, max(256, (32 << 20) // (8 * dim))))
    weight, bias, pool, pool64 = make_model(rng, dim, width, dtype, pool_size)
    schedule = build_schedule(rng, batch=batch, drafts=drafts, steps=steps, num_slots=num_slots, width=width,
                              pool_size=pool_size, accept_rate=args.accept_rate, mean_life=mean_life,
                              prompt_len=args.prompt_len)
    max_rows = max(1, batch * (1 + drafts))
    state = np.zeros((num_slots, state_len, dim), dtype=dtype)
    x_buf = np.empty((max_rows, dim), dtype=dtype)
    out_buf = np.zeros((max_rows, dim), dtype=dtype)

    torch_steps = 0
    torch_note = None
    if args.torch:
        try:
            import torch  # noqa: F401
            torch_steps = min(steps, args.torch_steps)
        except ImportError:
            torch_note = "torch is not installed"
    else:
        torch_note = "disabled (--no-torch)"

    checker = Checker(weight, bias, pool64, dtype) if args.check else None
    prefill_checker = Checker(weight, bias, pool64, dtype) if args.check else None
    # without --threads the calls take the default: up to `threads`, fewer while they stall
    _warm_up(schedule, state, weight, bias, pool, x_buf, out_buf, args.threads)
    before = gdnconv.thread_contention()
    ns, nbytes, snapshot, check_s, others, p_ns, p_tokens = run_gdnconv(
        schedule, state, weight, bias, pool, x_buf, out_buf, args.threads, checker, torch_steps, args.progress,
        prefill_checker)
    after = gdnconv.thread_contention()
    live = np.array([s.live_tokens for s in schedule])
    entries = sum(len(s.slots) for s in schedule)
    pads = sum(int(np.count_nonzero(s.slots == PAD_SLOT_ID)) for s in schedule)
    accepted = [s.accepted[s.slots != PAD_SLOT_ID] for s in schedule]
    accepted = np.concatenate(accepted) if accepted else np.zeros(0)

    result = {
        "config": {
            "preset": args.preset, "dim": dim, "width": width, "state_len": state_len, "batch": batch,
            "drafts": drafts, "accept_rate": args.accept_rate, "dtype": args.dtype, "isa": gdnconv.active_isa(),
            "threads": threads, "threads_adaptive": args.threads is None, "slots": num_slots, "steps": steps,
            "seed": args.seed, "mean_life": mean_life, "prompt_len": args.prompt_len,
        },
        "workload": {
            "requests": int(max((int(s.request_ids.max()) for s in schedule if len(s.request_ids)), default=-1) + 1),
            "live_tokens": int(live.sum()),
            "tokens_per_step": float(live.mean()),
            "pad_entries": pads,
            "pad_tokens": int(sum(len(s.pad_rows) for s in schedule)),   # fed but not counted in tokens/s
            "pad_fraction": pads / entries if entries else 0.0,
            "slot_resets": int(sum(len(s.resets) for s in schedule)),
            "mean_accepted": float(accepted.mean()) if accepted.size else 0.0,
        },
    }
    result["conditions"] = (
        "cold: the check between timed steps pushes each step's data out of the caches, as a model's "
        "other layers would; the same for the torch loop"
        if checker is not None else
        "warm: nothing runs between timed steps (--no-check), so each step finds its data in the caches")
    gd = _stats(ns, live)
    gd["gb_per_s"] = float(nbytes.sum() / (ns.sum() * 1e-9) / 1e9) if ns.sum() else 0.0
    gd["others_pct"] = others
    # default threads: team calls slower than one thread, times the team was halved, and
    # calls (decode and prefill) that then ran on fewer threads until a probe restored it
    for key in ("slow_calls", "reductions", "capped_calls"):
        gd["team_" + key] = after[key] - before[key]
    result["gdnconv"] = gd
    result["prefill"] = None
    if p_tokens.any():
        calls = p_tokens > 0
        total_s = p_ns.sum() * 1e-9
        result["prefill"] = {"calls": int(calls.sum()), "tokens": int(p_tokens.sum()),
                             "tokens_per_s": float(p_tokens.sum() / total_s) if total_s > 0 else 0.0,
                             "median_us": float(np.median(p_ns[calls]) / 1e3)}

    result["torch"] = None
    result["speedup"] = None
    torch_state_match = None
    if torch_steps:
        t_checker = Checker(weight, bias, pool64, dtype) if checker is not None else None
        t_ns, t_state, t_others = run_torch(schedule[:torch_steps], state.shape, weight, bias, pool, dtype,
                                            threads, t_checker, args.progress)
        result["torch"] = _stats(t_ns, live[:torch_steps])
        result["torch"]["replayed_steps"] = torch_steps
        result["torch"]["others_pct"] = t_others
        if t_checker is not None:   # information only: torch rounds conv1d's and silu's outputs separately
            result["torch"]["max_error_ratio"] = t_checker.max_ratio
        same = _stats(ns[:torch_steps], live[:torch_steps])
        result["speedup"] = {
            "steps": torch_steps,
            "total_time_ratio": float(t_ns.sum() / ns[:torch_steps].sum()),
            "median_latency_ratio": float(result["torch"]["median_us"] / same["median_us"]),
        }
        uint = np.dtype(f"u{np.dtype(dtype).itemsize}")
        torch_state_match = bool(np.array_equal(t_state.view(uint), snapshot.view(uint)))
    else:
        result["torch_note"] = torch_note

    ok = True
    if checker is not None:
        result["check"] = {
            "enabled": True, "steps": checker.steps, "outputs": checker.outputs,
            "max_error_ratio": checker.max_ratio, "max_abs_error": checker.max_abs, "worst": checker.worst,
            "pad_rows_untouched": checker.pad_violations == 0, "torch_state_match": torch_state_match,
            "seconds": check_s,
        }
        if result["prefill"] is not None:
            result["check"]["prefill"] = {"outputs": prefill_checker.outputs,
                                          "max_error_ratio": prefill_checker.max_ratio,
                                          "max_abs_error": prefill_checker.max_abs, "worst": prefill_checker.worst}
        ok = checker.ok and prefill_checker.ok and torch_state_match is not False
        result["check"]["ok"] = ok
    else:
        result["check"] = {"enabled": False}
    result["ok"] = ok
    busy = [p for p in (others, (result["torch"] or {}).get("others_pct")) if p is not None and p > BUSY_PCT]
    result["busy_others_pct"] = max(busy) if busy else None
    result["wall_s"] = time.perf_counter() - t_start
    return result


def _per_preset(value):
    """'8192 for qwen3-next, ...': ``value(preset)`` for every preset, for the help texts."""
    return ", ".join(f"{value(p)} for {name}" for name, p in PRESETS.items())


def _mean_life(steps):
    """The default --mean-life: steps / 8, within 4..64."""
    return max(4, min(64, steps // 8))


def add_arguments(parser):
    """Add the simulator's options to an argparse parser (every help text gives the default)."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-next",
                        help="model shape (default: %(default)s): "
                             + "; ".join(f"{k}: {v.about}" for k, v in PRESETS.items()))
    parser.add_argument("--dim", type=int, default=None,
                        help="conv channels D (default: the preset's, "
                             + _per_preset(lambda p: p.dim) + ")")
    parser.add_argument("--width", type=int, default=None,
                        help="kernel width W (default: the preset's, "
                             + _per_preset(lambda p: p.width) + ")")
    parser.add_argument("--batch", type=int, default=16,
                        help="batch positions (fixed, CUDA-graph style; default: %(default)s)")
    parser.add_argument("--drafts", type=int, default=3,
                        help="max draft tokens per request per step (each request draws 0..drafts; "
                             "default: %(default)s)")
    parser.add_argument("--accept-rate", type=float, default=0.7,
                        help="probability each draft is accepted (default: %(default)s)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="dtype of the inputs, weights, state and outputs (default: %(default)s; "
                             "bfloat16 needs ml_dtypes)")
    parser.add_argument("--steps", type=int, default=None,
                        help="decode steps (default: the preset's, "
                             + _per_preset(lambda p: p.steps) + ")")
    parser.add_argument("--slots", type=int, default=None,
                        help="conv-state slots in the pool (default: 2 x --batch, 32 for the default batch)")
    parser.add_argument("--mean-life", type=int, default=None,
                        help="mean request lifetime in steps (default: steps / 8 within 4..64, "
                             + _per_preset(lambda p: _mean_life(p.steps)) + ")")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the workload and the random data (default: %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=128,
                        help="joining requests first prefill a prompt of 1..N tokens through conv_prefill "
                             "(default: %(default)s; 0: they start from a zeroed slot)")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"kernel threads (default: gdnconv's, {gdnconv.get_num_threads()} on this machine, "
                             f"fewer for a while when threads wait for a busy core)")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="verify every output against the float64 reference (between timed steps, so the timed "
                             "calls find cold caches; default: on)")
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="replay the workload through the per-request torch loop when torch is installed "
                             "(default: on)")
    parser.add_argument("--torch-steps", type=int, default=300,
                        help="replay at most this many (leading) steps through the torch loop "
                             "(default: %(default)s)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="progress bar on stderr (tqdm; never when stderr is not a terminal; default: on)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the report (default: the report)")
    return parser


def run(args):
    """Entry point for ``gdnconv simulate``: returns the exit status (1 if the check failed)."""
    result = simulate(args)
    if args.json:
        print(json.dumps(finite_json(result), allow_nan=False))
    else:
        print(format_report(result))
    return 0 if result["ok"] else 1
