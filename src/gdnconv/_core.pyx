# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython layer over the C kernels: one extension module, its source split by
responsibility into files included here.

- ``_capi.pxd``: the C interface (the one mirror of ``include/gdnconv/gdnconv.h``).
- ``_arrays.pxi``: the arrays layer every op reuses (NumPy/DLPack/torch views, index
  arrays, new outputs); ``_checks.pxi``: the checks built on it (written arrays,
  aliasing, the arguments every op takes: activation, pad_slot_id, weight, bias).
- ``_runtime.pxi``: threads, CPU features, ISA selection.
- ``_update.pxi``: the conv update op; ``_prefill.pxi``: the conv prefill op.

Design:
- One extension module: the ISA choice and the thread settings live in C statics,
  so everything that calls the C core must share one copy of it.
- Arrays are read as (pointer, shape, byte strides, dtype code) through the NumPy C
  API, or for torch tensors through one call of torch's DLPack exchange API
  (``data_ptr()``/``stride()`` where torch cannot describe the tensor): NumPy cannot export ml_dtypes.bfloat16 through the buffer
  protocol and torch has none, so typed memoryviews are not used. torch is never
  imported here; a tensor is recognised only when the caller has imported torch
  already.
- Lifetimes: every argument conversion that can run user code (``__array__``,
  ``__len__``, torch methods) runs before the first pointer is taken, and every
  buffer the kernel touches (arguments, copies) is held by the call object's
  ``keep`` until the kernel returns; a tensor through its storage. torch code that a
  subclass's or a mode's ``__torch_function__`` overrides still runs after pointers
  are taken (``is_neg``, ``empty_like``, ``clone``...), so once the last such step is
  done every tensor view is checked against its storage's size and data pointer
  (``_in_storage``: two C methods of the storage, no torch function), which also
  refuses a storage shrunk before the call. The weight scratch is the C side's, per
  OS thread (threads.c).
- Overlap checks are exact but bounded (``_shares``): a read-only input whose overlap
  with a written array NumPy cannot decide in time is read from a copy; two such
  written arrays are refused.
- Every check of the error list runs before the kernel; the index arrays are
  checked in C (``gdn_update_validate``) in one pass. Nothing is written before that.
- ``conv_state`` and ``out`` are never copied. ``x`` is copied only when its
  channels are not contiguous and ``out`` is not ``x`` (so the SIMD path applies).
- The GIL is released around the kernel; threads start only inside it (threads.c).
- ``conv_update_multi`` and ``conv_prefill`` are plain C functions (``binding(False)``,
  the signature in the clinic format ``inspect.signature`` reads): ``torch.compile``
  can substitute the registered ops for a C function, not for a Cython one
  (``gdnconv._compile``), and the call costs no more.
  A forked child runs every call on its calling thread (``gdn_fork_guard_init``).
"""
import os
import sys

import numpy as np

cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport (PyCapsule_Destructor, PyCapsule_GetContext, PyCapsule_GetPointer, PyCapsule_IsValid,
                                PyCapsule_New, PyCapsule_SetContext)
from cpython.ref cimport PyObject, Py_XDECREF
from libc.stdint cimport int32_t, int64_t, intptr_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memset

from gdnconv._capi cimport *

cnp.import_array()

include "_arrays.pxi"
include "_checks.pxi"
include "_runtime.pxi"
include "_update.pxi"
include "_prefill.pxi"
