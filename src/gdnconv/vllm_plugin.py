"""vLLM general plugin: every conv call of vLLM 0.32's CPU backend computed by gdnconv.

ref: vLLM's plugin system (a ``vllm.general_plugins`` entry point, called once in every process
vLLM starts: API server, engine core, workers). ``pyproject.toml`` declares
``gdnconv = "gdnconv.vllm_plugin:register"``, so ``pip install gdnconv`` in a vLLM environment is
the whole set-up. ``GDNCONV_VLLM=0`` turns it off; ``VLLM_PLUGINS`` (vLLM's allow-list) too.

Design:
- One table, ``ROUTES``: per call site the module, the function, the parameters vLLM 0.32 gives
  it, and gdnconv's drop-in for it (same arguments, same return, same conventions: each
  drop-in passes the pad marker the function it replaces uses). ``register()`` checks the vLLM
  version and every row's signature first and patches only when all match; on anything it
  does not know it patches nothing and logs one line saying why. It never raises into vLLM.
- A patched function is replaced in its module and wherever an imported vLLM module holds it
  by name (``from ... import`` copies), so call sites bound before and after see gdnconv.
- Each routed call counts in ``gdnconv.vllm.counters()``. A call gdnconv refuses (an argument
  it does not know, or contradictory ones, e.g. half of prefix caching's block indices; nothing
  is written then) is handed to vLLM's own function and counted as a fallback, logged once per
  site. Prefix caching's block tables (``initial_state_idx``, ``block_idx_*``,
  ``num_computed_tokens``, ``block_size_to_align``, with ``null_block_id``) are routed, with the
  semantics of vLLM's Triton kernels (``gdnconv.vllm``), which vLLM's CPU functions lack.
- ``GDNCONV_VLLM_SHADOW=1``: each routed call also runs vLLM's own function on clones of its
  tensors and compares: the conv state bit for bit, outputs and the recurrent state within a
  bf16 tolerance; a mismatch raises (for tests, far slower).
- What vLLM's CPU backend runs where (0.32): on AVX512-BF16 and aarch64-BF16 CPUs the GDN layer
  calls ``_causal_conv1d_update_cpu`` / ``_causal_conv1d_fwd_cpu`` (C++ ops on packed weights);
  elsewhere, and for the Mamba/Mamba2 mixers, ShortConv and the Kimi and OLMo GDN layers,
  ``causal_conv1d_update_cpu`` / ``causal_conv1d_fn_cpu`` (ShortConv's decode on aarch64:
  ``causal_conv1d_update_torch``); speculative decoding runs the conv
  of ``_spec_forward`` (a per-request torch loop except for equal lengths on AMX / aarch64-BF16).
"""
import logging
import os
import sys
from typing import NamedTuple

__all__ = ["register", "ROUTES", "SUPPORTED_VLLM"]

SUPPORTED_VLLM = ("0.32.",)     # version prefixes whose call sites the table describes
_GDN = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
_CPU_CONV = "vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d"


_pending = []                   # the load line, while vLLM's logging is not configured yet


def _log():
    """vLLM's logger for this plugin (vLLM's handler and format), or a plain one without vLLM."""
    try:
        from vllm.logger import init_logger
        return init_logger("vllm.gdnconv")
    except Exception:
        return logging.getLogger("vllm.gdnconv")


def _announce(message=None):
    """Log the load line now if vLLM's logging is configured (plugins load before the engine
    configures it in the main process), else at this process's first routed call."""
    if message is not None:
        _pending[:] = [message]
    log = _log()
    if _pending and log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(_pending.pop())
_registered = []                # the (module, attribute, stock, wrapper) rows patched in this process


class Route(NamedTuple):
    site: str            # the counters' name
    module: str
    attribute: str
    params: tuple        # the stock function's parameter names in vLLM 0.32
    drop_in: str         # name of gdnconv's replacement in this module
    compare: tuple       # shadow mode: (argument names compared bit for bit, compared within tolerance)


ROUTES = (
    Route("gdn.decode", _GDN, "_causal_conv1d_update_cpu",
          ("x", "conv_states", "weight", "bias", "silu_activation", "conv_state_indices", "is_weight_packed",
           "num_accepted_tokens"), "_update_op", (("conv_states",), ())),
    Route("gdn.prefill", _GDN, "_causal_conv1d_fwd_cpu",
          ("x", "weight", "bias", "conv_states", "query_start_loc", "cache_indices", "has_initial_state",
           "silu_activation", "is_weight_packed"), "_prefill_op", (("conv_states",), ())),
    Route("gdn.spec", _GDN, "_spec_forward",
          ("layer", "attn_metadata_i", "mixed_qkv_spec", "b_spec", "a_spec", "conv_buf", "ssm_state", "width",
           "state_len"), "_spec_forward", (("conv_buf",), ("ssm_state",))),
    Route("conv.update", _CPU_CONV, "causal_conv1d_update_cpu",
          ("x", "conv_state", "weight", "bias", "activation", "conv_state_indices", "query_start_loc",
           "pad_slot_id", "kwargs"), "_update_cpu", (("conv_state",), ())),
    Route("conv.update_torch", _CPU_CONV, "causal_conv1d_update_torch",
          ("x", "conv_state", "weight", "bias", "activation"), "_update_torch", (("conv_state",), ())),
    Route("conv.prefill", _CPU_CONV, "causal_conv1d_fn_cpu",
          ("x", "weight", "bias", "conv_states", "query_start_loc", "cache_indices", "has_initial_state",
           "activation", "pad_slot_id", "kwargs"), "_fn_cpu", (("conv_states",), ())),
)


# ---- the drop-ins (vLLM's arguments in, vLLM's return out) ----
_gv = None                      # gdnconv.vllm, imported on first use (it imports torch)


def _vllm_adapters():
    global _gv
    import gdnconv.vllm
    _gv = gdnconv.vllm
    return _gv

def _update_op(*, x, conv_states, weight, bias, silu_activation, conv_state_indices, is_weight_packed,
               num_accepted_tokens=None, query_start_loc=None):
    """gdn_attention._causal_conv1d_update_cpu: x (B, D) or (B, T, D) channels last, conv_states
    (S, D, L) in either storage, pad -1; returns a new tensor like x, padded requests' rows zeros.
    With query_start_loc (int32, B + 1; the plugin's speculative conv, _spec_conv): x (N, D), and
    conv_state_indices may be vLLM's (B, k) block table, whose column 0 is each request's slot.
    One op call; where the op does not take it (a new out of 4 MiB or more, which the core takes
    from memory it reuses) one core call; else gdnconv.vllm's full path."""
    gv = _gv or _vllm_adapters()
    if (is_weight_packed is True or is_weight_packed is False) and not gv._is_compiling():   # as one op call
        # (weight and bias as they come: the direct call reads vLLM's Parameter subclass in place)
        out = gv._core._op_update(gv._op_new, gv._op_into, x, conv_states, weight, bias, silu_activation,
                                  num_accepted_tokens, conv_state_indices, gv.PAD_SLOT_ID, None,
                                  gv._OP_TOKENS_LAST | (gv._OP_PACKED if is_weight_packed else 0), query_start_loc)
        if out is not None:
            return out
    weight, bias = gv._plain(weight), gv._plain(bias)   # (once, for the try and the full path)
    slots = conv_state_indices
    if isinstance(slots, gv.torch.Tensor) and slots.dim() == 2:   # (the core takes the slots as a column)
        slots = slots[:, 0].contiguous()
    try:     # the usual call, as gdnconv.vllm.causal_conv1d_update tries it, in the op's (B, T, D) order
        return gv._core._conv_update_vllm(x, conv_states, weight, bias,
                                          activation=silu_activation, num_accepted_tokens=num_accepted_tokens,
                                          conv_state_indices=slots, query_start_loc=query_start_loc,
                                          plain_tensors=True,
                                          tokens_last=True,   # a new out: padded requests' rows are zeros
                                          is_weight_packed=is_weight_packed)
    except (TypeError, ValueError):
        pass
    out = gv.torch.zeros_like(x)        # rows of padded requests: zeros, as gdnconv's new outputs
    if x.dim() == 3:         # vLLM's C++ op takes (B, T, D); gdnconv.vllm reads vLLM's (B, D, T)
        gv.causal_conv1d_update(x.transpose(1, 2), conv_states, weight, bias, silu_activation, conv_state_indices,
                                num_accepted_tokens, query_start_loc, out=out.transpose(1, 2),
                                is_weight_packed=is_weight_packed)
    else:
        gv.causal_conv1d_update(x, conv_states, weight, bias, silu_activation, conv_state_indices,
                                num_accepted_tokens, query_start_loc, out=out, is_weight_packed=is_weight_packed)
    return out


def _prefill_op(*, x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                silu_activation, is_weight_packed):
    """gdn_attention._causal_conv1d_fwd_cpu: x (D, N), conv_states (S, D, L), pad -1."""
    return (_gv or _vllm_adapters()).causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                               silu_activation, is_weight_packed=is_weight_packed)


_CACHE_KW = ("block_idx_last_scheduled_token", "initial_state_idx", "block_idx_first_scheduled_token",
             "num_computed_tokens", "block_size_to_align")
# what vLLM 0.32's callers pass these functions through **kwargs (anything else: vLLM's function)
_UPDATE_KW = {"num_accepted_tokens", "max_query_len", "null_block_id", "validate_data", "is_weight_packed",
              "block_idx_last_scheduled_token", "initial_state_idx"}
_FN_KW = {"metadata", "validate_data", "null_block_id", "block_idx_first_scheduled_token",
          "block_idx_last_scheduled_token", "initial_state_idx", "num_computed_tokens", "block_size_to_align"}


def _untaken(kwargs, known):
    """Refuse (so that vLLM's own function takes the call) keyword arguments gdnconv does not
    know."""
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"unknown arguments {sorted(unknown)}")


def _cache_kw(kwargs):
    """Prefix caching's block-table arguments of a call, with null_block_id where given
    (vLLM's Triton semantics, which gdnconv.vllm follows for these calls)."""
    cache = {k: kwargs[k] for k in _CACHE_KW if kwargs.get(k) is not None}
    if cache and kwargs.get("null_block_id") is not None:
        cache["null_block_id"] = kwargs["null_block_id"]
    return cache


def _update_cpu(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                query_start_loc=None, pad_slot_id=None, **kwargs):
    """ops/cpu/causal_conv1d.causal_conv1d_update_cpu: its pad marker is pad_slot_id, else
    kwargs' null_block_id, else 0 (vLLM's NULL_BLOCK_ID); returns a new tensor, a copy of x with
    the live requests' rows computed (skipped rows keep x's values, as vLLM's op leaves them).
    Speculative arguments the stock function drops (num_accepted_tokens, max_query_len) are
    honoured as vLLM's Triton kernel defines them."""
    gv = _gv or _vllm_adapters()
    _untaken(kwargs, _UPDATE_KW)
    pad = pad_slot_id
    if pad is None:
        pad = kwargs.get("null_block_id")
        pad = gv.NULL_BLOCK_ID if pad is None else pad
    cache = _cache_kw(kwargs)
    # the usual call as one core call into a new out laid out like x (channels contiguous: the core
    # would compute a strided x on a contiguous copy, and return that copy's layout, not x's as vLLM)
    usual = (query_start_loc is None and not cache and type(kwargs.get("max_query_len", -1)) is int
             and x.dim() >= 2 and x.stride(1) == 1 and not gv._is_compiling())
    packed = kwargs.get("is_weight_packed", False)
    if usual and (packed is True or packed is False):   # the usual call as one op call
        # (weight and bias as they come: the direct call reads vLLM's Parameter subclass in place)
        out = gv._core._op_update(gv._op_new, gv._op_into, x, conv_state, weight, bias, activation,
                                  kwargs.get("num_accepted_tokens"), conv_state_indices, pad, None,
                                  gv._OP_SKIPPED_FROM_X | (gv._OP_PACKED if packed else 0))
        if out is not None:
            return out
    weight, bias = gv._plain(weight), gv._plain(bias)   # (once, for the try and the full path)
    if usual:
        try:     # its pad rows x's; x and the state alike in dtype
            return gv._core._conv_update_vllm(x, conv_state, weight, bias, activation=activation,
                                              num_accepted_tokens=kwargs.get("num_accepted_tokens"),
                                              conv_state_indices=conv_state_indices, pad_slot_id=pad,
                                              plain_tensors=True, skipped_rows_from_x=True,
                                              is_weight_packed=kwargs.get("is_weight_packed", False))
        except (TypeError, ValueError):
            pass
    gv._core._in_own_storage(x, "x")           # (before torch copies it)
    xc = x.to(conv_state.dtype, copy=True)    # vLLM computes on x.to(conv_state.dtype)
    res = gv.causal_conv1d_update(xc, conv_state, weight, bias, activation, conv_state_indices,
                                  kwargs.get("num_accepted_tokens"), query_start_loc,
                                  kwargs.get("max_query_len", -1), pad_slot_id=pad,
                                  is_weight_packed=kwargs.get("is_weight_packed", False), **cache)
    return res if res.dtype == x.dtype else res.to(x.dtype)


def _update_torch(x, conv_state, weight, bias=None, activation=None):
    """ops/cpu/causal_conv1d.causal_conv1d_update_torch (ShortConv's decode on aarch64): x
    (B, D, T), conv_state the batch's own (B, D, width - 1) states, rolled in place; returns a
    new (B, D, T) tensor. A longer state (the stock function rolls all of it) is not taken."""
    gv = _gv or _vllm_adapters()
    if conv_state.dim() != 3 or weight.dim() != 2 or conv_state.shape[-1] != weight.shape[-1] - 1:
        raise ValueError(f"conv_state of shape {tuple(conv_state.shape)} is not (batch, dim, width - 1) "
                         f"for weight {tuple(weight.shape)}")
    gv._core._in_own_storage(x, "x")           # (before torch copies it)
    return gv.causal_conv1d_update(x.to(conv_state.dtype, copy=True), conv_state, weight, bias, activation)


def _fn_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
            activation="silu", pad_slot_id=-1, **kwargs):
    """ops/cpu/causal_conv1d.causal_conv1d_fn_cpu: pad_slot_id marks padding (slot 0 live; the
    stock function reads no null_block_id, nor does this one)."""
    _untaken(kwargs, _FN_KW)
    return (_gv or _vllm_adapters()).causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                               activation, pad_slot_id, **_cache_kw(kwargs))


def _int32_rows(t, n, torch):
    """t's first n rows as int32: t itself where it is that already (vLLM's step metadata
    usually is; a slice and a ``.to`` cost ~1.5 us a tensor)."""
    if t.shape[0] != n:
        t = t[:n]
    return t if t.dtype is torch.int32 else t.to(torch.int32)


_via_getattr = {}   # (class, name) -> whether reading name from an instance reaches nn.Module.__getattr__
_VIA_GETATTR_MAX = 256   # (emptied when full: torch.nn.utils.parametrize makes a class per module,
                         # which refers to its module, so the dict would keep such modules alive)
_ABSENT = object()


def _member(module, name):
    """getattr(module, name) for a torch module's registered parameter, buffer or submodule
    (vLLM's ``layer.conv1d``, ``conv1d.weight``, ``conv1d.bias``, ``layer.A_log``): read from
    the module's dicts as nn.Module.__getattr__ reads them (_parameters, _buffers, _modules;
    ~0.2 us a read, through __getattr__ 0.45-0.6 us) where Python's lookup would call
    __getattr__: nothing of that name on the class or in the instance's __dict__, and the
    class's __getattr__ and __getattribute__ nn.Module's and object's. Else, or not
    registered there: getattr. The class is looked at on its first read of the name (a class
    changed afterwards, a property or __getattr__ added to it, is not seen)."""
    try:
        key = (type(module), name)
        reaches = _via_getattr.get(key)
    except TypeError:   # (a class that cannot be hashed)
        return getattr(module, name)
    if reaches is None:
        import torch
        cls = key[0]
        reaches = (issubclass(cls, torch.nn.Module) and cls.__getattr__ is torch.nn.Module.__getattr__
                   and cls.__getattribute__ is object.__getattribute__
                   and not any(name in vars(k) for k in cls.__mro__))
        if len(_via_getattr) >= _VIA_GETATTR_MAX:
            _via_getattr.clear()
        _via_getattr[key] = reaches
    if reaches:
        own = module.__dict__
        if name not in own:   # (the three in turn, as __getattr__ reads them; a loop took ~0.1 us more)
            members = own.get("_parameters", _ABSENT)
            if members is not _ABSENT and name in members:
                return members[name]
            members = own.get("_buffers", _ABSENT)
            if members is not _ABSENT and name in members:
                return members[name]
            members = own.get("_modules", _ABSENT)
            if members is not _ABSENT and name in members:
                return members[name]
    return getattr(module, name)


def _spec_forward(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state, width, state_len):
    """gdn_attention._spec_forward with its conv as one varlen gdnconv call (query_start_loc,
    num_accepted_tokens; the wide buffer rolled as vLLM's Triton kernel rolls it), then vLLM's own
    recurrent kernel exactly as the stock function calls it."""
    conv_out, idx, num_acc, qsl = _spec_conv(layer, attn_metadata_i, mixed_qkv_spec, conv_buf)
    query, key, value = layer.rearrange_mixed_qkv(conv_out)
    return sys.modules[_GDN].ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
        A_log=_member(layer, "A_log"), dt_bias=_member(layer, "dt_bias"),
        q=query.squeeze(0), k=key.squeeze(0), v=value.squeeze(0), a=a_spec, b=b_spec, initial_state_source=ssm_state,
        spec_state_indices=idx.contiguous(), num_accepted_tokens=num_acc.contiguous(), cu_seqlens=qsl.contiguous(),
        use_qk_l2norm_in_kernel=True)


def _spec_conv(layer, attn_metadata_i, mixed_qkv_spec, conv_buf):
    """_spec_forward's conv: (its out, the step's block table, num_accepted_tokens and
    query_start_loc as int32, for the recurrent kernel): _update_op's varlen call into a new out
    (benchmarks/bench_op.py times it)."""
    import torch
    n = attn_metadata_i.num_spec_decodes
    qsl = _int32_rows(attn_metadata_i.spec_query_start_loc, n + 1, torch)
    idx = _int32_rows(attn_metadata_i.spec_state_indices_tensor, n, torch)
    num_acc = _int32_rows(attn_metadata_i.num_accepted_tokens, n, torch)
    # a weight vLLM packed at load (its plain copy stashed beside it) goes in packed, for
    # gdnconv.vllm's kept float32 form of it; else vLLM's plain (D, W) view. The block table's
    # column 0 is each request's slot (gdnconv.vllm's convention); the call checks
    # query_start_loc against the tokens
    conv1d = _member(layer, "conv1d")
    packed = getattr(conv1d, "_cpu_unpacked_conv_weight", None) is not None
    weight = _member(conv1d, "weight") if packed else sys.modules[_GDN]._unpacked_conv_weight(layer)
    conv_out = _update_op(x=mixed_qkv_spec, conv_states=conv_buf, weight=weight, bias=_member(conv1d, "bias"),
                          silu_activation=layer.activation == "silu", conv_state_indices=idx,
                          is_weight_packed=packed, num_accepted_tokens=num_acc, query_start_loc=qsl)
    return conv_out, idx, num_acc, qsl


# ---- routing ----

def _params(fn):
    import inspect
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


# The routed function: stock's own parameters, each passed on as bound, so that a call costs what a
# call of the drop-in does (forwarding *args and **kwargs took ~0.5 us more a call); _forwarding
# writes its parameter list and call.
_ROUTED = """def routed({params}):
    if _gdn_pending:
        _gdn_announce()
    try:
        _gdn_result = _gdn_drop_in({call})
    except (ValueError, TypeError) as _gdn_e:     # refused before anything was written
        return _gdn_refused(_gdn_e)({call})
    _gdn_counts["routed"] += 1
    return _gdn_result
"""


def _forwarding(fn):
    """(parameters, call): fn's parameter list without defaults and a call passing each parameter
    on as bound, as source. Positional-only parameters, ``*args`` and names of the routed
    function's own (``_gdn_``) are not written: ValueError (vLLM 0.32's functions have none)."""
    import inspect
    params, call = [], []
    for p in inspect.signature(fn, follow_wrapped=False).parameters.values():   # fn's own defaults
        if p.name.startswith("_gdn_") or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
            raise ValueError(f"{fn.__name__}'s parameter {p} cannot be forwarded")
        if p.kind is p.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        params.append(f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name)
        call.append(f"**{p.name}" if p.kind is p.VAR_KEYWORD else
                    f"{p.name}={p.name}" if p.kind is p.KEYWORD_ONLY else p.name)
    return ", ".join(params), ", ".join(call)


def _wrap(route, stock, drop_in, shadow):
    """stock's replacement: drop_in with stock's parameters and defaults, counted; a call drop_in
    refuses (nothing written) goes to stock, logged once; in shadow mode each routed call is
    compared with stock's on clones."""
    import gdnconv.vllm as gv
    counts = gv._counters.setdefault(route.site, {"routed": 0, "fallback": 0})
    warned = []

    def refused(e):
        counts["fallback"] += 1
        if not warned:
            warned.append(1)
            _log().warning("gdnconv: %s handed to vLLM's %s (%s)", route.site, route.attribute, e)
        return stock

    params, call = _forwarding(stock)
    scope = {"__name__": __name__, "_gdn_pending": _pending, "_gdn_announce": _announce, "_gdn_drop_in": drop_in,
             "_gdn_refused": refused, "_gdn_counts": counts}
    exec(_ROUTED.format(params=params, call=call), scope)
    routed = scope["routed"]
    routed.__defaults__, routed.__kwdefaults__ = stock.__defaults__, stock.__kwdefaults__

    def shadowed(*args, **kwargs):
        shadow_run = _shadow_stock(route, stock, args, kwargs)
        before = counts["routed"]
        result = routed(*args, **kwargs)
        if counts["routed"] > before:
            _shadow_check(route, stock, shadow_run, args, kwargs, result)
        return result

    wrapper = shadowed if shadow else routed
    wrapper.__wrapped__ = stock
    wrapper.__name__ = stock.__name__
    wrapper.__doc__ = f"gdnconv's drop-in for vLLM's {route.attribute} (gdnconv.vllm_plugin.{route.drop_in})."
    return wrapper


def _clone(v):
    import torch
    return v.clone() if isinstance(v, torch.Tensor) else v


def _bound(stock, args, kwargs):
    import inspect
    b = inspect.signature(stock).bind(*args, **kwargs)
    return b.arguments


def _shadow_stock(route, stock, args, kwargs):
    """vLLM's own function run on clones of the call's tensors: (its result, its cloned arguments)."""
    cargs = [_clone(a) for a in args]
    ckw = {k: _clone(v) for k, v in kwargs.items()}
    return stock(*cargs, **ckw), _bound(stock, cargs, ckw)


def _shadow_check(route, stock, shadow_run, args, kwargs, result):
    import torch
    stock_result, stock_args = shadow_run
    ours = _bound(stock, args, kwargs)
    exact, close = route.compare
    for name in exact:
        a, b = ours[name], stock_args[name]
        if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
            raise AssertionError(f"gdnconv shadow: {route.site}: {name} differs from vLLM's bit for bit")
    for name, a, b in [(n, ours[n], stock_args[n]) for n in close] + [("result", result, stock_result)]:
        a, b = a.float(), b.float()
        scale = float(b.abs().max()) if b.numel() else 0.0
        torch.testing.assert_close(a, b, rtol=2 ** -6, atol=2 ** -6 * max(scale, 1e-6),
                                   msg=lambda m: f"gdnconv shadow: {route.site}: {name} differs from vLLM's: {m}")


def _replace(old, new):
    """Put ``new`` wherever an imported vLLM module holds ``old`` by name (its own module and the
    ``from ... import`` copies of it)."""
    for m in [m for name, m in list(sys.modules.items()) if name.startswith("vllm") and m is not None]:
        for attr, value in list(vars(m).items()):
            if value is old:
                setattr(m, attr, new)


def _stand_down(why, level=logging.WARNING):
    """One line saying why nothing is routed (a warning: vLLM's logging may not be configured
    yet, and Python prints warnings anyway)."""
    _log().log(level, "gdnconv: vLLM plugin stands down: %s", why)


def register():
    """vLLM's entry point: route vLLM 0.32's CPU conv calls through gdnconv, once per process.

    Cheap and idempotent; never raises: anything unexpected (another vLLM version, a signature
    that changed, not a CPU platform, GDNCONV_VLLM=0) leaves vLLM untouched, with one log line.
    """
    if _registered:
        return
    try:
        if os.environ.get("GDNCONV_VLLM", "1").strip() == "0":
            return _stand_down("GDNCONV_VLLM=0", logging.INFO)
        import importlib

        import vllm
        version = getattr(vllm, "__version__", "?")
        if not version.startswith(SUPPORTED_VLLM):
            return _stand_down(f"vLLM {version} is not one it knows ({', '.join(v + 'x' for v in SUPPORTED_VLLM)})")
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return _stand_down(f"not vLLM's CPU platform ({type(current_platform).__name__})")
        plan = []
        for route in ROUTES:
            module = importlib.import_module(route.module)
            stock = getattr(module, route.attribute, None)
            if stock is None or _params(stock) != route.params:
                return _stand_down(f"{route.module}.{route.attribute} is not vLLM 0.32's "
                                   f"(parameters {None if stock is None else _params(stock)})")
            plan.append((route, module, stock))
        shadow = os.environ.get("GDNCONV_VLLM_SHADOW", "").strip() not in ("", "0")
        this = sys.modules[__name__]
        for route, module, stock in plan:
            wrapper = _wrap(route, stock, getattr(this, route.drop_in), shadow)
            _replace(stock, wrapper)
            _registered.append((route, module, stock, wrapper))
        import gdnconv
        _announce(f"gdnconv {gdnconv.__version__} routes vLLM {version}'s CPU conv (isa {gdnconv.active_isa()}"
                  f"{', shadow mode' if shadow else ''}): "
                  + ", ".join(f"{r.attribute} ({r.site})" for r in ROUTES))
    except Exception as e:          # never stop vLLM from starting
        _unpatch()
        _stand_down(f"{type(e).__name__}: {e}")


def _unpatch():
    """vLLM's own functions back wherever a wrapper of this process was put."""
    for _, module, stock, wrapper in _registered:
        _replace(wrapper, stock)
    _registered.clear()
