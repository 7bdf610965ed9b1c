# Type stubs of the compiled module (_core.pyx); keep in step with its signatures.
# Arrays are NumPy arrays or torch CPU tensors: typed structurally (shape and dtype) so
# that neither torch nor a torch stub is needed to check a caller.
from typing import Any, Literal, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

class _ArrayOrTensor(Protocol):
    """A NumPy array or a torch tensor."""

    @property
    def shape(self) -> Any: ...
    @property
    def dtype(self) -> Any: ...

_A = TypeVar("_A", bound=_ArrayOrTensor)

# "swish" is "silu"; True/False as vLLM's flag
_Activation = Literal["silu", "swish"] | bool | None
# integer arrays, tensors or sequences; None for the default
_Index = npt.ArrayLike | None

@overload
def conv_update_multi(
    x: _A,
    conv_state: _ArrayOrTensor,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    num_accepted_tokens: _Index = None,
    conv_state_indices: _Index = None,
    query_start_loc: _Index = None,
    pad_slot_id: int = -1,
    out: None = None,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    is_weight_packed: bool = False,
) -> _A: ...
@overload
def conv_update_multi(
    x: _ArrayOrTensor | npt.ArrayLike,
    conv_state: _ArrayOrTensor,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    num_accepted_tokens: _Index = None,
    conv_state_indices: _Index = None,
    query_start_loc: _Index = None,
    pad_slot_id: int = -1,
    out: _A,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    is_weight_packed: bool = False,
) -> _A: ...
@overload
def conv_update_multi(
    x: npt.ArrayLike,
    conv_state: _ArrayOrTensor,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    num_accepted_tokens: _Index = None,
    conv_state_indices: _Index = None,
    query_start_loc: _Index = None,
    pad_slot_id: int = -1,
    out: None = None,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    is_weight_packed: bool = False,
) -> npt.NDArray[Any]: ...
def bytes_moved(
    x: _ArrayOrTensor | npt.ArrayLike,
    conv_state: _ArrayOrTensor,
    weight: _ArrayOrTensor,
    *,
    num_accepted_tokens: _Index = None,
    conv_state_indices: _Index = None,
    query_start_loc: _Index = None,
    pad_slot_id: int = -1,
    initial_state_indices: _Index = None,
) -> int: ...
@overload
def conv_prefill(
    x: _A,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    conv_state: _ArrayOrTensor | None = None,
    query_start_loc: _Index = None,
    cache_indices: _Index = None,
    has_initial_state: _Index = None,
    pad_slot_id: int = -1,
    out: None = None,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    snapshots: _Index = None,
    is_weight_packed: bool = False,
) -> _A: ...
@overload
def conv_prefill(
    x: _ArrayOrTensor | npt.ArrayLike,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    conv_state: _ArrayOrTensor | None = None,
    query_start_loc: _Index = None,
    cache_indices: _Index = None,
    has_initial_state: _Index = None,
    pad_slot_id: int = -1,
    out: _A,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    snapshots: _Index = None,
    is_weight_packed: bool = False,
) -> _A: ...
@overload
def conv_prefill(
    x: npt.ArrayLike,
    weight: _ArrayOrTensor,
    bias: _ArrayOrTensor | None = None,
    *,
    activation: _Activation = "silu",
    conv_state: _ArrayOrTensor | None = None,
    query_start_loc: _Index = None,
    cache_indices: _Index = None,
    has_initial_state: _Index = None,
    pad_slot_id: int = -1,
    out: None = None,
    num_threads: int | None = None,
    initial_state_indices: _Index = None,
    snapshots: _Index = None,
    is_weight_packed: bool = False,
) -> npt.NDArray[Any]: ...
def prefill_bytes_moved(
    x: _ArrayOrTensor | npt.ArrayLike,
    weight: _ArrayOrTensor,
    *,
    conv_state: _ArrayOrTensor | None = None,
    query_start_loc: _Index = None,
    cache_indices: _Index = None,
    has_initial_state: _Index = None,
    pad_slot_id: int = -1,
    initial_state_indices: _Index = None,
    snapshots: _Index = None,
) -> int: ...
@overload
def pack_weight(weight: _A) -> _A: ...
@overload
def pack_weight(weight: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def set_num_threads(n: int | None) -> None: ...
def get_num_threads() -> int: ...
def set_out_cache_bytes(nbytes: int) -> int: ...
def out_cache_bytes() -> int: ...
def thread_contention() -> dict[str, int | float]: ...
def cpu_features() -> dict[str, bool]: ...
def compiled_isas() -> list[str]: ...
def available_isas() -> list[str]: ...
def active_isa() -> str: ...
def set_isa(name: str | None = None) -> str: ...
def last_path() -> str | None: ...
def _set_parallel_min_bytes(nbytes: int) -> int: ...
def _hold_threads(cap: int | None, seconds: float) -> None: ...
def _adapt_step(n: int, slow: bool, now: float) -> int: ...
def _tensor_values(a: Any, name: str) -> np.ndarray: ...
