"""A long speculative-decoding stream checked against a from-scratch causal conv.

Model of the caller (SPEC "conv_update_multi", example W=4, k=3, L=6): each step a
live request feeds 1 + k tokens (its newly verified token and k drafts, k varying per
request and per step, so the batch is varlen via query_start_loc). Output j of the
step must be the causal conv of the request's accepted stream followed by tokens
0..j of this step. Afterwards a prefix of 1..1+k of the tokens is accepted; that
count is the request's num_accepted_tokens in its next step. Requests join (a prompt
whose last W-1 tokens are written into rows 0..W-2 of a reused slot, num_accepted=1)
and leave, sit out steps (marked with pad_slot_id, state untouched), and pure pad
entries are mixed in.
"""
import zlib

import numpy as np
import pytest

import gdnconv
from gdnconv.reference import causal_conv1d_ref
from gdnconv.testing import assert_bits_equal, assert_outputs_close, bits
from conftest import DTYPES, f64, reference

STEPS = 120


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("W,kmax,extra", [(4, 3, 0), (4, 1, 2), (2, 2, 0), (8, 3, 1)],
                         ids=["W4-k3-L6", "W4-k1-L6", "W2-k2-L3", "W8-k3-L11"])
def test_speculative_stream(isa, dtype, W, kmax, extra):
    dt = DTYPES[dtype]
    D, S = 32, 6
    L = W - 1 + kmax + extra
    rng = np.random.default_rng(zlib.crc32(f"{dtype}-{W}-{kmax}-{extra}".encode()))
    weight = (rng.standard_normal((D, W)) / np.sqrt(W)).astype(dt)
    bias = (rng.standard_normal(D) * 0.3).astype(dt)
    # garbage in free slots, scaled before the cast (NumPy 2.0 makes bf16 * 7 float32)
    state = (rng.standard_normal((S, L, D)) * 7).astype(dt)
    live = {}          # slot -> {"stream": float64 (n, D) accepted tokens, "nat": int}
    checked_outputs = 0
    joins = leaves = 0
    for step in range(STEPS):
        # requests leave, then new ones join free slots (slots get reused)
        for s in list(live):
            if rng.random() < 0.08:
                del live[s]
                leaves += 1
        for s in range(S):
            if s not in live and rng.random() < 0.35:
                plen = int(rng.integers(0, 7))
                prompt = rng.standard_normal((plen, D)).astype(dt)
                hist = np.concatenate([np.zeros((W - 1, D), dt), prompt])[-(W - 1):]
                state[s, :W - 1] = hist                                   # rows W-1.. keep garbage
                live[s] = {"stream": prompt.astype(np.float64), "nat": 1}
                joins += 1
        # the batch: live requests (some sitting this step out) and pure pad entries
        entries = []
        for s in rng.permutation(list(live)):
            s = int(s)
            if rng.random() < 0.1:
                entries.append(("pad", s, int(rng.integers(1, kmax + 2))))   # sits out
            else:
                entries.append(("live", s, 1 + int(rng.integers(0, kmax + 1))))
        for _ in range(int(rng.integers(0, 3))):
            pos = int(rng.integers(0, len(entries) + 1))
            entries.insert(pos, ("pad", None, int(rng.integers(0, kmax + 2))))
        lens = [n for _, _, n in entries]
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        x = rng.standard_normal((int(qsl[-1]), D)).astype(dt)
        idx = np.array([s if kind == "live" else -1 for kind, s, _ in entries], np.int32)
        nat = np.array([live[s]["nat"] if kind == "live" else int(rng.integers(0, L - W + 3))
                        for kind, s, _ in entries], np.int32)
        out = (rng.standard_normal(x.shape) * 100).astype(dt)
        out_before = bits(out)
        state_before = bits(state)
        _, ref_state, _ = reference(x, state, weight, bias, num_accepted_tokens=nat,
                                    conv_state_indices=idx, query_start_loc=qsl)
        res = gdnconv.conv_update_multi(x, state, weight, bias, num_accepted_tokens=nat,
                                        conv_state_indices=idx, query_start_loc=qsl, out=out)
        assert res is out
        assert_bits_equal(state, ref_state, f"conv_state after step {step}")
        touched = set()
        for i, (kind, s, n) in enumerate(entries):
            rows = slice(int(qsl[i]), int(qsl[i + 1]))
            if kind == "pad":
                assert np.array_equal(bits(out)[rows], out_before[rows]), f"pad rows, step {step}"
                continue
            touched.add(s)
            req = live[s]
            tokens = f64(x[rows])
            seq = np.concatenate([req["stream"], tokens])
            expected = causal_conv1d_ref(seq, weight, bias, "silu")[-n:]
            mag = causal_conv1d_ref(np.abs(seq), np.abs(f64(weight)), np.abs(f64(bias)), None)[-n:]
            assert_outputs_close(out[rows], expected, mag, dt, silu=True,
                                 err_msg=f"step {step}, request in slot {s}, {n} tokens, nat {req['nat']}")
            checked_outputs += n
            accepted = int(rng.integers(1, n + 1))
            req["stream"] = np.concatenate([req["stream"], tokens[:accepted]])
            req["nat"] = accepted
        for s in range(S):   # slots of sitting-out requests and free slots are untouched
            if s not in touched:
                assert np.array_equal(bits(state)[s], state_before[s]), f"slot {s}, step {step}"
    assert checked_outputs > 500 and joins > 5 and leaves > 5
