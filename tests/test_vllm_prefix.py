"""gdnconv.vllm with vLLM's prefix-caching arguments (block tables): the mapping to the core's
read slots, write slots and snapshots (gdnconv.reference.vllm_block_table_ref), checked against
the float64 reference with the whole state cache compared bit for bit, vLLM issue 56196's short
chunk, pads and the null block, speculative decoding on block tables, and the refusals of
contradictory block indices (nothing written)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gdnconv.vllm as gv  # noqa: E402
from gdnconv.reference import conv_prefill_ref, conv_update_multi_ref, prefill_magnitude, magnitude  # noqa: E402
from gdnconv.reference import vllm_block_table_ref  # noqa: E402
from gdnconv.testing import assert_bits_equal, assert_outputs_close, to_numpy  # noqa: E402

K = 16          # block_size_to_align
W = 4


def _cache(g, S, L, D, dtype, storage):
    """vLLM's (S, D, L) view of its cache: "SD" storage (channels contiguous) or "DS"."""
    if storage == "SD":
        return torch.randn(S, L, D, generator=g).to(dtype).transpose(1, 2)
    return torch.randn(S, D, L, generator=g).to(dtype)


def _table(lengths, computed, S, g, null=None):
    """vLLM-like metadata: each request's blocks from the one holding token nct - 1 to the one
    holding its last token, distinct random blocks (none is the null block)."""
    B = len(lengths)
    blocks = [int(b) for b in torch.randperm(S, generator=g) if int(b) != null]
    table = torch.full((B, 10), -1 if null is None else null, dtype=torch.int32)
    first = torch.tensor([n // K for n in computed], dtype=torch.int32)
    last = torch.tensor([(n + max(T, 1) - 1) // K for T, n in zip(lengths, computed)], dtype=torch.int32)
    init = torch.tensor([max(n - 1, 0) // K for n in computed], dtype=torch.int32)
    for i in range(B):
        for c in range(int(min(init[i], first[i])), int(last[i]) + 1):
            table[i, c] = blocks.pop()
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    return table, qsl, first, last, init, torch.tensor(computed, dtype=torch.int32)


def _gd(cache):
    """The cache in gdnconv's (S, L, D) order as NumPy (bf16 through ml_dtypes)."""
    return to_numpy(cache.transpose(1, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("storage", ["SD", "DS"])
def test_prefill_with_block_tables_matches_the_definition(dtype, storage):
    g = torch.Generator().manual_seed(1)
    D, S = 48, 40
    # 0, 1 and several boundaries; T = 2 < W - 1 with its last block not its initial one (issue
    # 56196); a boundary 1 token in; a request without initial state; one on the null block
    lengths, computed = [40, 2, 12, 9, 5], [3, 31, 0, 15, 16]
    table, qsl, first, last, init, nct = _table(lengths, computed, S, g, null=0)
    table[4, int(init[4])] = 0                        # request 4 starts from the null block: skipped
    has_init = torch.tensor([True, True, False, True, True])
    cache = _cache(g, S, W - 1 + 2, D, dtype, storage)
    weight = (torch.randn(D, W, generator=g) / 2).to(dtype)
    bias = (torch.randn(D, generator=g) / 2).to(dtype)
    x = torch.randn(int(qsl[-1]), D, generator=g).to(dtype)
    before = _gd(cache).copy()
    out = gv.causal_conv1d_fn(x.T, weight, bias, cache, qsl, cache_indices=table, has_initial_state=has_init,
                              null_block_id=0, block_idx_first_scheduled_token=first,
                              block_idx_last_scheduled_token=last, initial_state_idx=init,
                              num_computed_tokens=nct, block_size_to_align=K)
    reads, writes, snaps = vllm_block_table_ref(table, qsl, init, last, first, nct, K)
    assert reads[1] != writes[1] and lengths[1] < W - 1
    writes[4] = -1
    snaps = [s for s in snaps if s[0] != 4]
    assert sorted({sum(s[0] == i for s in snaps) for i in range(4)}) == [0, 1, 2]
    kw = dict(activation="silu", conv_state=before, query_start_loc=qsl.numpy(), cache_indices=writes,
              has_initial_state=has_init.numpy(), initial_state_indices=reads, snapshots=snaps)
    ref, ref_state = conv_prefill_ref(to_numpy(x), to_numpy(weight), to_numpy(bias), **kw)
    mag = prefill_magnitude(to_numpy(x), to_numpy(weight), to_numpy(bias), **kw)
    live = ~np.isnan(ref)
    assert_outputs_close(out.T, np.where(live, ref, 0), np.where(live, mag, 0), silu=True)
    assert_bits_equal(_gd(cache), ref_state, "the whole cache")
    # issue 56196: the short chunk's state is in its last block; its initial block holds the snapshot
    # after 1 token (a block boundary), not the new state
    assert snaps[[s[0] for s in snaps].index(1)][1:] == (1, reads[1])


@pytest.mark.parametrize("spec", [False, True])
def test_update_with_block_tables(spec):
    g = torch.Generator().manual_seed(2)
    D, S, B, T = 40, 24, 4, 3 if spec else 1
    L = W - 2 + T if spec else W - 1
    cache = _cache(g, S, L, D, torch.bfloat16, "SD")
    weight = (torch.randn(D, W, generator=g) / 2).bfloat16()
    bias = (torch.randn(D, generator=g) / 2).bfloat16()
    table = torch.randperm(S - 1, generator=g)[:B * 3].reshape(B, 3).int() + 1
    table[2, 0] = 0                                   # request 2 reads the null block: skipped
    init = torch.tensor([0, 1, 0, 2], dtype=torch.int32)
    last = torch.tensor([1, 1, 2, 2], dtype=torch.int32)   # request 1 and 3 read and write one block
    x = torch.randn(B, D, T, generator=g).bfloat16()
    x_before = x.clone()
    nat = torch.tensor([3, 1, 2, 2], dtype=torch.int32) if spec else None
    before = _gd(cache).copy()
    gv.causal_conv1d_update(x, cache, weight, bias, "silu", table, nat, null_block_id=0,
                            block_idx_last_scheduled_token=last, initial_state_idx=init)
    reads, writes, _ = vllm_block_table_ref(table, range(B + 1), init, last)
    writes[2] = -1
    kw = dict(activation="silu", num_accepted_tokens=None if nat is None else nat.numpy(),
              conv_state_indices=writes, initial_state_indices=reads)
    xg = to_numpy(x_before.transpose(1, 2))
    ref, ref_state = conv_update_multi_ref(xg, before, to_numpy(weight), to_numpy(bias), **kw)
    mag = magnitude(xg, before, to_numpy(weight), to_numpy(bias), **kw)
    live = ~np.isnan(ref)
    assert_outputs_close(x.transpose(1, 2), np.where(live, ref, to_numpy(x_before.transpose(1, 2))),
                         np.where(live, mag, 0), silu=True)   # out=None: written into x; skipped rows kept
    assert_bits_equal(_gd(cache), ref_state, "the whole cache")


def _prefill_call(**over):
    g = torch.Generator().manual_seed(3)
    D, S = 16, 12
    table, qsl, first, last, init, nct = _table([20, 6], [4, 0], S, g)
    kw = dict(cache_indices=table, has_initial_state=torch.tensor([True, False]),
              block_idx_first_scheduled_token=first, block_idx_last_scheduled_token=last, initial_state_idx=init,
              num_computed_tokens=nct, block_size_to_align=K)
    kw.update(over)
    cache = _cache(g, S, W - 1, D, torch.float32, "SD")
    return cache, (torch.randn(26, D, generator=g).T, torch.randn(D, W, generator=g), None, cache, qsl), kw


@pytest.mark.parametrize("case, match", [
    ("count", r"block_idx_last_scheduled_token\[0\] - block_idx_first_scheduled_token\[0\] = 2, but request 0's "
              r"20 tokens after num_computed_tokens\[0\] = 4 cross 1 boundaries"),
    ("column", r"initial_state_idx\[1\] = 10 is not a column of cache_indices \(shape \(2, 10\)\)"),
    ("write_pad", r"block_idx_last_scheduled_token\[1\] = 1 points at cache_indices\[1, 1\] = -1, a pad/null block"),
    ("snap_pad", r"cache_indices\[0, 0\] = -1 is a pad/null block, but request 0 stores the state after 12"),
    ("align", r"block_size_to_align = 12 must be a positive multiple of 8"),
    ("partial", r"num_computed_tokens given without block_idx_first_scheduled_token"),
    ("core", r"snapshots\[0, 2\] = \d+ is a slot the call writes already"),
    ("shrunk_table", r"cache_indices lies outside its storage: its elements span bytes 0\.\.80 of a storage of 8"),
    ("shrunk_column", r"num_computed_tokens lies outside its storage: its elements span bytes 0\.\.8 of a storage "
                      r"of 0"),
])
def test_prefill_refuses_contradictory_block_indices(case, match):
    """Request 0: 20 tokens after 4 (one boundary, at 12, stored in its initial block); request 1:
    6 tokens from nothing."""
    cache, args, kw = _prefill_call()
    table = kw["cache_indices"] = kw["cache_indices"].clone()
    if case == "count":
        kw["block_idx_last_scheduled_token"] = torch.tensor([2, 0], dtype=torch.int32)
        table[0, 2] = 11
    elif case == "column":
        kw["initial_state_idx"] = torch.tensor([0, 10], dtype=torch.int32)
    elif case == "write_pad":
        kw["block_idx_last_scheduled_token"] = torch.tensor([1, 1], dtype=torch.int32)
    elif case == "snap_pad":
        kw["initial_state_idx"] = torch.tensor([1, 0], dtype=torch.int32)
        table[0, 0] = -1
    elif case == "align":
        kw["block_size_to_align"] = 12
    elif case == "shrunk_table":   # its values are read on the host: not past a shrunk storage
        table.untyped_storage().resize_(8)
    elif case == "shrunk_column":
        kw["num_computed_tokens"] = kw["num_computed_tokens"].clone()
        kw["num_computed_tokens"].untyped_storage().resize_(0)
    elif case == "partial":
        del kw["block_idx_first_scheduled_token"], kw["block_idx_last_scheduled_token"], kw["initial_state_idx"]
    else:   # the core's own check: request 1's final block is request 0's snapshot block
        table[1, 0] = table[0, 0]
    before = cache.clone()
    with pytest.raises(ValueError, match=match):
        gv.causal_conv1d_fn(*args, **kw)
    assert torch.equal(cache.view(torch.int32), before.view(torch.int32))


def test_update_refuses_a_live_request_writing_the_null_block():
    g = torch.Generator().manual_seed(4)
    cache = _cache(g, 8, W - 1, 16, torch.float32, "SD")
    weight = torch.randn(16, W, generator=g)
    x = torch.randn(2, 16, generator=g)
    x_before, before = x.clone(), cache.clone()
    table = torch.tensor([[3, 0], [4, 5]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"block_idx_last_scheduled_token\[0\] = 1 points at conv_state_indices"
                                         r"\[0, 1\] = 0, a pad/null block"):
        gv.causal_conv1d_update(x, cache, weight, None, "silu", table, null_block_id=0,
                                block_idx_last_scheduled_token=torch.tensor([1, 1], dtype=torch.int32),
                                initial_state_idx=torch.tensor([0, 0], dtype=torch.int32))
    assert torch.equal(cache, before) and torch.equal(x, x_before)
