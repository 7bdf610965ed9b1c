"""The simulator's report: the human-readable lines and strict JSON of a result dict."""
import math

import numpy as np

from gdnconv.timing import busy_note, busy_warning


def _si(v):
    """1234567 -> '1.23 M'."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g}"


def format_report(r):
    """The human-readable report for a result dict."""
    c, w, g = r["config"], r["workload"], r["gdnconv"]
    lines = [
        f"gdnconv simulate: preset {c['preset']} (D={c['dim']}, W={c['width']}, state_len={c['state_len']}), "
        f"{c['dtype']}, isa {c['isa']}, threads {c['threads']}"
        f"{' (the default: fewer for a while when a thread waits for a CPU)' if c.get('threads_adaptive') else ''}",
        f"  batch {c['batch']} positions, drafts 0..{c['drafts']} per request, accept rate {c['accept_rate']:.2f}, "
        f"{c['slots']} slots, {c['steps']} steps, seed {c['seed']}",
        f"  {w['requests']} requests ({w['slot_resets']} slot resets), {w['live_tokens']} tokens "
        f"({w['tokens_per_step']:.1f}/step), {w['mean_accepted']:.2f} accepted/request-step, "
        f"{100 * w['pad_fraction']:.1f}% pad entries",
        f"timing     : {r['conditions']}",
        f"gdnconv    : {_si(g['tokens_per_s'])} tokens/s, step median {g['median_us']:.1f} us, "
        f"p99 {g['p99_us']:.1f} us, {g['gb_per_s']:.1f} GB/s (kernel call only){busy_note(g['others_pct'])}",
    ]
    pf = r.get("prefill")
    if pf is not None:
        lines.append(f"prefill    : {_si(pf['tokens_per_s'])} prompt tokens/s, {pf['tokens']} tokens in "
                     f"{pf['calls']} conv_prefill calls (prompts of 1..{c['prompt_len']}), "
                     f"call median {pf['median_us']:.1f} us")
    if g.get("team_slow_calls") or g.get("team_capped_calls"):
        calls = c["steps"] + (pf["calls"] if pf else 0)
        lines.append(f"threads    : {g['team_slow_calls']} of {calls} timed calls were slower than on one thread "
                     f"(one of their threads started late, waiting for a CPU); so {g['team_reductions']} times "
                     f"gdnconv used half the threads for a while, and {g['team_capped_calls']} calls ran on fewer "
                     f"than {c['threads']} threads (gdnconv.thread_contention())")
    cond = r["conditions"].split(":")[0]
    t = r["torch"]
    if t is not None:
        part = "" if t["replayed_steps"] == c["steps"] else f", first {t['replayed_steps']} of {c['steps']} steps"
        lines.append(f"torch loop : {_si(t['tokens_per_s'])} tokens/s, step median {t['median_us']:.1f} us, "
                     f"p99 {t['p99_us']:.1f} us (same inputs replayed{part}){busy_note(t['others_pct'])}")
        s = r["speedup"]
        lines.append(f"speed-up   : gdnconv is {s['total_time_ratio']:.1f}x faster "
                     f"({s['median_latency_ratio']:.1f}x on median step latency) over {s['steps']} steps, "
                     f"both {cond}" + ("; NOT TRUSTWORTHY, the machine was busy" if r["busy_others_pct"] else ""))
    else:
        lines.append(f"torch loop : skipped, {r.get('torch_note')}")
    k = r["check"]
    if k["enabled"]:
        verdict = "OK" if k["ok"] else "FAILED"
        lines.append(f"check      : {k['outputs']} outputs of {k['steps']} steps vs float64 reference: "
                     f"max error {k['max_error_ratio']:.3g} x tolerance (max abs {k['max_abs_error']:.3g}) {verdict}")
        if k.get("prefill"):
            kp = k["prefill"]
            lines.append(f"  prefill: {kp['outputs']} prompt outputs, max error {kp['max_error_ratio']:.3g} x "
                         f"tolerance (max abs {kp['max_abs_error']:.3g})")
        if k["max_error_ratio"] > 1.0 and k["worst"]:
            wd = k["worst"]
            lines.append(f"  worst: step {wd['step']}, position {wd['position']} (request {wd['request']}, "
                         f"slot {wd['slot']}), token {wd['token']}, channel {wd['channel']}: "
                         f"got {wd['got']:.6g}, want {wd['want']:.6g}")
        if not k["pad_rows_untouched"]:
            lines.append("  pad entries' output rows were written (must be left as they were)")
        if k["torch_state_match"] is not None:
            lines.append(f"  torch replay state {'matches' if k['torch_state_match'] else 'DIFFERS from'} "
                         f"gdnconv's bit for bit")
    else:
        lines.append("check      : disabled (--no-check)")
    lines.append(f"wall time  : {r['wall_s']:.1f} s" + (f" ({k['seconds']:.1f} s checking)" if k["enabled"] else ""))
    if r["busy_others_pct"]:
        lines.append(busy_warning(r["busy_others_pct"]))
    return "\n".join(lines)


def finite_json(v):
    """``v`` with NumPy scalars made plain and non-finite floats as strings (strict JSON)."""
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_json(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
