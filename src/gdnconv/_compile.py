"""torch.compile of the plain calls: ``gdnconv.conv_update_multi`` and ``gdnconv.conv_prefill``
called on tensors inside a compiled function trace as the ``gdnconv::`` ops of ``gdnconv.torch``.

Design:
- Dynamo cannot look into a C function; ``torch.compiler.substitute_in_graph(original)(traceable)``
  tells it to trace ``traceable`` (same signature) in its place. Eager calls are untouched: the C
  function runs as before, at no extra cost per call (an ``is_compiling()`` test in a Python
  wrapper would add more than the whole call costs at small sizes).
- The substitution needs ``torch._dynamo``, which takes seconds to import, so gdnconv never
  imports it (nor torch): ``watch()``, run by ``import gdnconv``, registers at once where
  ``torch._dynamo`` is already imported, else right after its import (a ``sys.meta_path``
  entry that wraps its loader and then leaves ``sys.meta_path``). ``torch.compile`` imports it
  before it traces, so a compile finds the substitutions in place whatever the import order.
- ``substitute(original, traceable)`` adds a pair (other gdnconv modules' functions: what the
  client layers use when their own Python cannot be traced); registered on the same schedule.
- A failure to register never breaks the import of ``torch._dynamo``: it warns once, and
  eager calls work as before.
"""
import importlib.util
import sys
import warnings

_pending = []           # (original, traceable) pairs not yet registered
_ready = False          # torch._dynamo is imported: pairs register as they come


def _register_pending():
    from torch.compiler import substitute_in_graph
    while _pending:
        original, traceable = _pending.pop(0)
        try:
            substitute_in_graph(original)(traceable)
        except Exception as e:   # never raise into torch's import or the caller's
            warnings.warn(f"gdnconv: torch.compile cannot trace {original.__qualname__} ({type(e).__name__}: "
                          f"{e}); call {traceable.__module__}.{traceable.__qualname__} in compiled code",
                          RuntimeWarning, stacklevel=2)


def _on_dynamo():
    """torch._dynamo is imported: the plain ops' pairs, then every pair added so far."""
    global _ready
    if _ready:
        return
    _ready = True
    from . import _core, torch as _ops
    _pending[:0] = [(_core.conv_update_multi, _ops.conv_update_multi), (_core.conv_prefill, _ops.conv_prefill)]
    _register_pending()


def substitute(original, traceable):
    """While ``torch.compile`` traces, trace ``traceable`` in place of ``original`` (same
    signature; ``original`` a function, Python or C). Registered now when ``torch._dynamo`` is
    imported, else right after its import; never imports torch. Each ``original`` once."""
    _pending.append((original, traceable))
    if _ready:
        _register_pending()


class _AfterDynamoImport:
    """A ``sys.meta_path`` entry that runs ``_on_dynamo`` once ``torch._dynamo`` has been imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)    # the finders after this one
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                _on_dynamo()
            except Exception as e:
                warnings.warn(f"gdnconv: torch.compile cannot trace the plain gdnconv calls ({type(e).__name__}: "
                              f"{e}); call gdnconv.torch.conv_update_multi / conv_prefill in compiled code",
                              RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_then_register
        return spec


def watch():
    """Register the substitutions now (``torch._dynamo`` imported) or after its import."""
    if "torch._dynamo" in sys.modules:
        _on_dynamo()
    elif not any(isinstance(f, _AfterDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamoImport())
