"""Prefix caching in the core ops: a state read from one slot and written to another
(``initial_state_indices``), and the prefill's boundary ``snapshots``, against the float64
reference on every ISA, the whole state buffer compared bit for bit (the slots that must not be
written included); refused combinations leave every byte as it was."""
import numpy as np
import pytest

import gdnconv
from conftest import DTYPES, alloc
from gdnconv.reference import (conv_prefill_ref, conv_update_multi_ref, magnitude, prefill_magnitude,
                               vllm_block_table_ref)
from gdnconv.testing import assert_bits_equal, assert_outputs_close


def _state(rng, S, L, D, dtype, layout):
    """(S, L, D) state: channel-contiguous, or vLLM's DS storage seen as (S, L, D)."""
    if layout == "sd":
        return alloc(rng, (S, L, D), dtype)
    return np.ascontiguousarray(alloc(rng, (S, D, L), dtype)).transpose(0, 2, 1)


def _weights(rng, D, W, dtype):
    return alloc(rng, (D, W), dtype, scale=0.5), alloc(rng, (D,), dtype, scale=0.5)


def _check_update(x, state, w, b, **kw):
    before = state.copy()
    out = gdnconv.conv_update_multi(x, state, w, b, activation="silu", **kw)
    ref_out, ref_state = conv_update_multi_ref(x, before, w, b, activation="silu", **kw)
    mag = magnitude(x, before, w, b, **kw)
    live = ~np.isnan(ref_out)
    assert_outputs_close(out, np.where(live, ref_out, 0.0), np.where(live, mag, 0.0), silu=True)
    assert_bits_equal(state, ref_state, "conv_state (every slot)")


def _check_prefill(x, state, w, b, num_threads=None, **kw):
    before = state.copy()
    out = gdnconv.conv_prefill(x, w, b, activation="silu", conv_state=state, num_threads=num_threads, **kw)
    ref_out, ref_state = conv_prefill_ref(x, w, b, activation="silu", conv_state=before, **kw)
    mag = prefill_magnitude(x, w, b, conv_state=before, **kw)
    live = ~np.isnan(ref_out)
    assert_outputs_close(out, np.where(live, ref_out, 0.0), np.where(live, mag, 0.0), silu=True)
    assert np.all(np.asarray(out)[~live] == 0), "rows of skipped requests: zeros in a new out"
    assert_bits_equal(state, ref_state, "conv_state (every slot)")
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["sd", "ds"])
@pytest.mark.parametrize("mode", ["plain", "spec"])
def test_update_reads_one_slot_and_writes_another(isa, rng, dtype, layout, mode):
    D, W, S, B = 72, 4, 16, 5
    T = 1 if mode == "plain" else 3
    L = W - 1 if mode == "plain" else W - 2 + T + 1
    state = _state(rng, S, L, D, DTYPES[dtype], layout)
    w, b = _weights(rng, D, W, DTYPES[dtype])
    x = alloc(rng, (B, T, D), DTYPES[dtype])
    writes = np.array([3, 7, -1, 9, 12], dtype=np.int32)
    reads = np.array([3, 1, 5, 1, 14], dtype=np.int32)      # own slot, shared block, pad's ignored
    kw = dict(conv_state_indices=writes, initial_state_indices=reads)
    if mode == "spec":
        kw["num_accepted_tokens"] = np.array([1, 3, 2, 2, 3], dtype=np.int32)
    _check_update(x, state, w, b, **kw)


def test_update_varlen_with_block_slots_and_empty_requests(isa, rng):
    D, W, S = 40, 4, 12
    state = _state(rng, S, W - 2 + 4, D, DTYPES["fp32"], "sd")
    w, b = _weights(rng, D, W, DTYPES["fp32"])
    qsl = np.array([0, 2, 2, 6, 7], dtype=np.int32)
    x = alloc(rng, (7, D), DTYPES["fp32"])
    _check_update(x, state, w, b, query_start_loc=qsl, conv_state_indices=[4, 5, 6, 0],
                  initial_state_indices=[8, 9, 10, 11], num_accepted_tokens=[2, 1, 4, 1])


def _prefill_case(rng, dtype, layout, D=72, W=4, S=24, lengths=(37, 2, 20, 9, 0, 16), nct=(5, 15, 0, 15, 0, 6),
                  k=8, init=(1, 1, 0, 1, 1, 1), pad=(False, False, False, False, False, True)):
    """A prefill with vLLM-like block tables: request b's first block holds the tokens from
    num_computed_tokens[b], snapshots at every multiple of k crossed, the final state in the
    block of its last token, the history read from the block of token nct - 1."""
    B = len(lengths)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    x = alloc(rng, (int(qsl[-1]), D), DTYPES[dtype])
    state = _state(rng, S, W - 1 + 1, D, DTYPES[dtype], layout)
    w, b = _weights(rng, D, W, DTYPES[dtype])
    free = iter(rng.permutation(S))
    table = np.full((B, 12), -1, dtype=np.int32)
    first, last, init_col = [], [], []
    for i, (T, n) in enumerate(zip(lengths, nct)):
        f, l = n // k, (n + max(T, 1) - 1) // k
        first.append(f)
        last.append(l)
        init_col.append(max((n - 1) // k, 0))
        for c in range(min(f, max((n - 1) // k, 0)), l + 1):
            table[i, c] = next(free)
        if pad[i]:
            table[i, init_col[i]] = -1
    reads, writes, snaps = vllm_block_table_ref(table, qsl, init_col, last, first, nct, k)
    writes = [s if r != -1 else -1 for r, s in zip(reads, writes)]
    snaps = [s for s in snaps if writes[s[0]] != -1]
    kw = dict(query_start_loc=qsl, cache_indices=np.array(writes, dtype=np.int32),
              has_initial_state=np.array(init, dtype=bool), initial_state_indices=np.array(reads, dtype=np.int32),
              snapshots=np.array(snaps, dtype=np.int32).reshape(-1, 3))
    return x, state, w, b, kw


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("layout", ["sd", "ds"])
def test_prefill_writes_boundary_snapshots_and_reads_the_initial_block(isa, rng, dtype, layout):
    # 0, 1 and several boundaries crossed, a chunk shorter than width - 1 (vLLM issue 56196),
    # a boundary 1 token in (the snapshot takes history rows), no initial state, an empty and
    # a padded request
    x, state, w, b, kw = _prefill_case(rng, dtype, layout)
    assert {0, 1} <= {sum(1 for s in kw["snapshots"] if s[0] == i) for i in range(6)}
    assert max(sum(1 for s in kw["snapshots"] if s[0] == i) for i in range(6)) >= 3
    _check_prefill(x, state, w, b, **kw)


def test_prefill_snapshots_on_threads_and_long_chunks(isa, rng):
    """Requests longer than a time chunk (256 tokens), split over threads: each snapshot is
    written once, by the unit that holds token 0, before any state is written."""
    previous = gdnconv._core._set_parallel_min_bytes(0)
    try:
        x, state, w, b, kw = _prefill_case(rng, "bf16", "sd", D=300, lengths=(600, 3, 300), nct=(40, 7, 0),
                                           k=64, init=(1, 1, 0), pad=(False, False, False), S=40)
        _check_prefill(x, state, w, b, num_threads=2, **kw)
    finally:
        gdnconv._core._set_parallel_min_bytes(previous)


def test_a_snapshot_is_the_state_of_the_prefix(rng):
    """Independent of the reference: a snapshot after p tokens equals the state a prefill of
    the first p tokens leaves, bit for bit."""
    D, W = 48, 4
    x = alloc(rng, (1, 19, D), DTYPES["bf16"])
    w, b = _weights(rng, D, W, DTYPES["bf16"])
    state = alloc(rng, (6, W - 1, D), DTYPES["bf16"])
    ps = [1, 2, 7, 19]
    full = state.copy()
    gdnconv.conv_prefill(x, w, b, conv_state=full, cache_indices=[0], has_initial_state=[1],
                         initial_state_indices=[5], snapshots=[[0, p, 1 + j] for j, p in enumerate(ps)])
    for j, p in enumerate(ps):
        part = state.copy()
        gdnconv.conv_prefill(x[:, :p], w, b, conv_state=part, cache_indices=[0], has_initial_state=[1],
                             initial_state_indices=[5])
        assert_bits_equal(full[1 + j], part[0], f"snapshot after {p} tokens")
    assert_bits_equal(full[5], state[5], "the read slot")


# ------------------------------------------------------------------------ refusals

def _refused(call, state, out, match):
    before_state = state.copy()
    before_out = out.copy()
    with pytest.raises(ValueError, match=match):
        call()
    assert_bits_equal(state, before_state, "conv_state after a refused call")
    assert_bits_equal(out, before_out, "out after a refused call")


@pytest.mark.parametrize("kw, match", [
    (dict(initial_state_indices=[0, 9]), r"initial_state_indices\[1\] = 9 is out of range"),
    (dict(initial_state_indices=[0, -1]), r"initial_state_indices\[1\] = -1 is out of range"),
    (dict(initial_state_indices=[2, 3]), r"initial_state_indices\[0\] = 2 is a slot another request .* "
                                         r"\(conv_state_indices\[1\]\)"),
    (dict(initial_state_indices=[4, 3], num_accepted_tokens=[2, 1]),
     r"num_accepted_tokens\[0\] = 2 is more than request 0's 1 tokens"),
])
def test_update_refuses_contradictory_read_slots(rng, kw, match):
    D, W = 16, 4
    state = alloc(rng, (6, W, D), DTYPES["fp32"])
    w, b = _weights(rng, D, W, DTYPES["fp32"])
    x = alloc(rng, (2, 1, D), DTYPES["fp32"])
    out = np.zeros_like(x)
    _refused(lambda: gdnconv.conv_update_multi(x, state, w, b, conv_state_indices=[1, 2], out=out, **kw),
             state, out, match)


@pytest.mark.parametrize("kw, match", [
    (dict(snapshots=[[1, 2, 5], [0, 2, 4]]), r"snapshots\[1, 0\] = 0 must name a request .* non-decreasing"),
    (dict(snapshots=[[2, 1, 5]]), r"snapshots\[0, 0\] = 2 must name a request"),
    (dict(snapshots=[[0, 1, 5]], cache_indices=[-1, 2]), r"snapshots\[0, 0\] = 0 must name a request"),
    (dict(snapshots=[[0, 0, 5]]), r"snapshots\[0, 1\] = 0 tokens is outside 1..T_i"),
    (dict(snapshots=[[1, 5, 5]]), r"snapshots\[0, 1\] = 5 tokens is outside 1..T_i"),
    (dict(snapshots=[[0, 1, 6]]), r"snapshots\[0, 2\] = 6 is out of range"),
    (dict(snapshots=[[0, 1, 2]]), r"snapshots\[0, 2\] = 2 is a slot the call writes already"),
    (dict(snapshots=[[0, 1, 4], [1, 1, 4]]), r"snapshots\[1, 2\] = 4 is a slot the call writes already"),
    (dict(snapshots=[[0, 1, 4]], initial_state_indices=[0, 4], has_initial_state=[1, 1]),
     r"initial_state_indices\[1\] = 4 is a slot another request .* \(a snapshot of another request\)"),
    (dict(initial_state_indices=[0, 7], has_initial_state=[0, 1]), r"initial_state_indices\[1\] = 7 is out"),
    (dict(snapshots=[[0, 1]]), r"snapshots must be \(K, 3\)"),
])
def test_prefill_refuses_contradictory_snapshots(rng, kw, match):
    D, W = 16, 4
    state = alloc(rng, (6, W - 1, D), DTYPES["fp32"])
    w, b = _weights(rng, D, W, DTYPES["fp32"])
    x = alloc(rng, (2, 4, D), DTYPES["fp32"])
    out = np.zeros_like(x)
    kw = dict(dict(cache_indices=[1, 2]), **kw)
    _refused(lambda: gdnconv.conv_prefill(x, w, b, conv_state=state, out=out, **kw), state, out, match)


def test_prefill_read_slot_is_ignored_without_initial_state(rng):
    """initial_state_indices of a request without has_initial_state is not read, so not checked."""
    D, W = 16, 4
    state = alloc(rng, (6, W - 1, D), DTYPES["fp32"])
    w, b = _weights(rng, D, W, DTYPES["fp32"])
    x = alloc(rng, (2, 4, D), DTYPES["fp32"])
    _check_prefill(x, state, w, b, cache_indices=[1, 2], has_initial_state=[0, 1], initial_state_indices=[99, 0])


def test_prefill_cache_arguments_need_conv_state(rng):
    w, b = _weights(rng, 16, 4, DTYPES["fp32"])
    x = alloc(rng, (1, 4, 16), DTYPES["fp32"])
    for kw in (dict(initial_state_indices=[0]), dict(snapshots=[[0, 1, 0]])):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} is given without conv_state"):
            gdnconv.conv_prefill(x, w, b, **kw)


def test_byte_model_counts_the_copies_and_snapshots(rng):
    D, W = 64, 4
    state = alloc(rng, (8, W - 1, D), DTYPES["bf16"])
    w, _ = _weights(rng, D, W, DTYPES["bf16"])
    x = alloc(rng, (2, 20, D), DTYPES["bf16"])
    base = gdnconv.prefill_bytes_moved(x, w, conv_state=state, cache_indices=[0, 1], has_initial_state=[1, 1])
    more = gdnconv.prefill_bytes_moved(x, w, conv_state=state, cache_indices=[0, 1], has_initial_state=[1, 1],
                                       initial_state_indices=[0, 5], snapshots=[[0, 8, 2], [0, 16, 3], [1, 4, 4]])
    assert more - base == (1 + 3) * (W - 1) * D * 2
    xu = alloc(rng, (2, 1, D), DTYPES["bf16"])
    assert (gdnconv.bytes_moved(xu, state, w, conv_state_indices=[0, 1], initial_state_indices=[0, 5])
            - gdnconv.bytes_moved(xu, state, w, conv_state_indices=[0, 1])) == (W - 1) * D * 2
