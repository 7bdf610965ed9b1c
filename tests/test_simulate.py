"""The simulator (``gdnconv simulate``): passes on a correct kernel, catches a broken one,
and its incremental ground truth equals the whole-stream reference."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gdnconv
from gdnconv import simulate
from gdnconv.reference import causal_conv1d_ref
from conftest import run_python


def _run(capsys, *extra):
    parser = simulate.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--preset", "tiny", "--steps", "40", "--json", "--no-progress", *extra])
    rc = simulate.run(args)
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("prompt_len", [None, "0"])
def test_tiny_passes_within_tolerance(capsys, prompt_len):
    """The default run (joining requests prefill a prompt into a reused, unzeroed slot)
    and --prompt-len 0 (they start from a zeroed slot) pass the check."""
    pytest.importorskip("torch")
    rc, r = _run(capsys, *(["--prompt-len", prompt_len] if prompt_len else []))
    assert rc == 0 and r["ok"]
    check = r["check"]
    assert check["steps"] == 40 and check["outputs"] == r["workload"]["live_tokens"] * r["config"]["dim"]
    assert 0.0 < check["max_error_ratio"] <= 1.0
    assert check["pad_rows_untouched"] and check["torch_state_match"]
    assert r["workload"]["pad_entries"] > 0
    if prompt_len is None:      # the prefill phase is on by default; slots are reused unzeroed
        assert r["config"]["prompt_len"] == 128 and r["workload"]["slot_resets"] == 0
        assert r["prefill"]["calls"] > 0 and r["workload"]["requests"] > r["config"]["batch"]
        assert 0.0 < check["prefill"]["max_error_ratio"] <= 1.0
    else:
        assert r["workload"]["slot_resets"] > r["config"]["batch"]      # slots were zeroed and reused


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_other_dtypes_pass(capsys, dtype):
    rc, r = _run(capsys, "--dtype", dtype, "--no-torch")
    assert rc == 0 and r["check"]["max_error_ratio"] <= 1.0


@pytest.mark.parametrize("corrupt", ["output", "state"])
def test_corrupted_kernel_is_caught(capsys, monkeypatch, corrupt):
    """One wrong output value, or one wrong state row (which only later outputs can
    reveal: the ground truth never reads the kernel's state), fails the check."""
    real = gdnconv.conv_update_multi
    calls = {"n": 0}

    def broken(x, conv_state, *a, **kw):
        out = real(x, conv_state, *a, **kw)
        calls["n"] += 1
        if calls["n"] > 10:               # from about step 10 on (after warm-up calls)
            live = [i for i, s in enumerate(kw["conv_state_indices"]) if s >= 0]
            i = live[0]
            if corrupt == "output":
                row = kw["query_start_loc"][i]
                out[row, 5] = out[row, 5] + np.float32(0.25)
            else:
                conv_state[kw["conv_state_indices"][i], :, 7] += np.float32(0.5)
        return out

    monkeypatch.setattr(gdnconv, "conv_update_multi", broken)
    rc, r = _run(capsys, "--no-torch")
    assert rc != 0 and not r["ok"]
    assert r["check"]["max_error_ratio"] > 1.0
    assert r["check"]["worst"]["step"] >= 5


def test_incremental_reference_matches_whole_stream():
    """The per-step windows built from each request's last W-1 accepted tokens give the
    same outputs as causal_conv1d_ref over the request's whole accepted stream."""
    rng = np.random.default_rng(1)
    W, D, P = 4, 8, 64
    weight, bias, pool, pool64 = simulate.make_model(rng, D, W, np.float32, P)
    schedule = simulate.build_schedule(rng, batch=5, drafts=3, steps=60, num_slots=7, width=W, pool_size=P,
                                       accept_rate=0.6, mean_life=6)
    checker = simulate.Checker(weight, bias, pool64, np.float32)
    streams = {}                                       # request id -> accepted pool rows
    for step in schedule:
        ref, _ = checker.reference(step.windows)
        qsl = step.query_start_loc
        for i, rid in enumerate(step.request_ids):
            if rid < 0:
                continue
            fed = list(step.tokens[qsl[i]:qsl[i + 1]])
            history = streams.setdefault(int(rid), [])
            whole = causal_conv1d_ref(pool64[history + fed], weight, bias)[len(history):]
            rows = np.searchsorted(step.rows, np.arange(qsl[i], qsl[i + 1]))
            np.testing.assert_allclose(ref[rows], whole, rtol=1e-12, atol=1e-12)
            history.extend(fed[:step.accepted[i]])
    assert len(streams) > 5


def test_cli_version_and_help():
    res = run_python("from gdnconv.__main__ import main; main(['--version'])")
    assert res.stdout.strip() == f"gdnconv {gdnconv.__version__}"
    res = run_python("from gdnconv.__main__ import main; main(['simulate', '--help'])")
    assert res.returncode == 0
    options = " ".join(res.stdout.split("options:", 1)[1].split())
    for flag in ("--dtype", "--seed", "--batch", "--preset"):
        text = options.split(f" {flag} ", 1)[1].split(" --", 1)[0]
        assert text.count("default") == 1, (flag, text)


def test_cli_help_is_plain_text_with_every_default():
    """gdnconv, gdnconv simulate and gdnconv generate --help: no reST ``literal`` marks, every
    option's help gives its default (--steps with the preset's number); python -m gdnconv alone
    prints the help and exits 0."""
    from gdnconv import generate
    for cmd in ([], ["simulate"], ["generate"]):
        res = run_python(f"from gdnconv.__main__ import main; main({cmd + ['--help']!r})")
        assert res.returncode == 0 and res.stdout.startswith("usage: gdnconv"), res.stderr
        assert "``" not in res.stdout, res.stdout
    for module in (simulate, generate):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        for action in parser._actions:
            if action.dest != "help":
                assert "(default: " in action.help or "; default: " in action.help, (module.__name__, action.dest)
    res = run_python("from gdnconv.__main__ import main; main(['simulate', '--help'])")
    steps = " ".join(res.stdout.split(" --steps STEPS ", 1)[1].split(" --slots", 1)[0].split())
    assert steps == "decode steps (default: the preset's, 1500 for qwen3-next, 1200 for qwen3.5-27b, 120 for tiny)"
    res = subprocess.run([sys.executable, "-m", "gdnconv"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert res.returncode == 0 and res.stdout.startswith("usage: gdnconv") and "simulate" in res.stdout, res


def test_threads_line_in_plain_words(capsys):
    """The report's threads line (default threads, some calls slower than one thread) says what
    happened without jargon."""
    _, r = _run(capsys, "--no-torch")
    r["gdnconv"].update(team_slow_calls=5, team_reductions=2, team_capped_calls=30)
    line = [ln for ln in simulate.format_report(r).splitlines() if ln.startswith("threads    :")][0]
    calls = r["config"]["steps"] + (r["prefill"]["calls"] if r["prefill"] else 0)
    assert line.startswith(f"threads    : 5 of {calls} timed calls were slower than on one thread"), line
    assert "2 times gdnconv used half the threads" in line and "30 calls ran on fewer than" in line, line
    assert "team" not in line, line


def test_bfloat16_without_ml_dtypes_says_what_to_install():
    res = run_python("import sys; sys.modules['ml_dtypes'] = None\n"
                     "from gdnconv.__main__ import main; main(['simulate', '--preset', 'tiny', '--steps', '2'])")
    assert res.returncode != 0
    assert 'pip install ml_dtypes' in res.stderr and 'pip install ".[sim]"' in res.stderr
    assert "--dtype float32" in res.stderr


def test_report_says_conditions_and_warns_when_busy(capsys):
    _, r = _run(capsys, "--no-torch")
    assert r["conditions"].startswith("cold:")
    assert "timing     : cold:" in simulate.format_report(r)
    r["gdnconv"]["others_pct"] = r["busy_others_pct"] = 150.0
    text = simulate.format_report(r)
    assert "[other processes: 150% of a CPU]" in text and "WARNING" in text
