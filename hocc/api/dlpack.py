"""Arrays of other libraries (CuPy, NumPy, JAX, ...) in the drop-in calls.

Any argument with `__dlpack__` becomes a torch tensor through
torch.from_dlpack: a view of the caller's memory (zero-copy), so results land
in the caller's array, also for async_op=True once the Work completed. A CUDA
array's call runs on its library's current stream (CuPy's
cupy.cuda.get_current_stream(); other libraries: torch's current stream,
which torch.from_dlpack orders after the producer's), so the collective is
ordered after the caller's own work on the array and before what it does next,
as a torch tensor's call is on torch's current stream.

An array that cannot be shared so (not contiguous, read-only where a result
goes, or refused by its library) raises a HoccError before any byte moves."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from hocc.api.validate import HoccError

F = TypeVar("F", bound=Callable[..., Any])

KDL_CUDA, KDL_CUDA_MANAGED = 2, 13  # DLPack device types that live on a CUDA device


_NEVER = frozenset((torch.Tensor, type(None), str, bool, int, float))  # argument types that are never arrays
_is_array_type: dict[type, bool] = {}  # per argument type: a failed attribute lookup costs ~1 us a call


def is_array(obj: object) -> bool:
    """An object from another library that DLPack can share (a torch.Tensor is not one)."""
    kind = type(obj)
    known = _is_array_type.get(kind)
    if known is None:
        known = _is_array_type[kind] = not issubclass(kind, torch.Tensor) and hasattr(kind, "__dlpack__")
    return known


def _has_array(values: Iterable[object]) -> bool:
    """Whether any value (or element of a list value) is an array: a plain loop, as
    every drop-in call with tensors only pays for it."""
    for v in values:
        kind = type(v)
        if kind in _NEVER:
            continue
        if kind is list or kind is tuple:
            for x in v:  # type: ignore[attr-defined]  # a list or tuple, by its exact type
                if is_array(x):
                    return True
        elif is_array(v):
            return True
    return False


def _library(obj: object) -> str:
    return type(obj).__module__.split(".")[0]


def as_tensor(obj: object, what: str, fn: str, writable: bool) -> torch.Tensor:
    """A zero-copy torch view of `obj` (returned as is when it is a tensor already)."""
    if isinstance(obj, torch.Tensor) or not hasattr(obj, "__dlpack__"):
        return obj  # type: ignore[return-value]  # validate.check_tensor names what is wrong
    kind = f"{_library(obj)}.{type(obj).__name__}"
    flags = getattr(obj, "flags", None)
    if writable and flags is not None and getattr(flags, "writeable", True) is False:
        raise HoccError(f"hocc.{fn}: {what} is a read-only {kind}, and the result is written into it; "
                        f"pass a writable array (e.g. {what}.copy())")
    try:
        t = torch.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise HoccError(f"hocc.{fn}: {what} ({kind}) cannot be shared with torch through DLPack: {e}; "
                        "pass a contiguous, writable array of a supported dtype, or a torch.Tensor") from None
    if not t.is_contiguous():
        raise HoccError(f"hocc.{fn}: {what} is a non-contiguous {kind} (strides {tuple(t.stride())}); pass a "
                        f"C-contiguous array ({_library(obj)}.ascontiguousarray) and copy the result back")
    return t


def _cuda_index(obj: object) -> int | None:
    """The CUDA device an array lives on, or None for host memory."""
    try:
        kind, index = obj.__dlpack_device__()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return None
    return int(index) if int(kind) in (KDL_CUDA, KDL_CUDA_MANAGED) else None


@contextlib.contextmanager
def caller_stream(arrays: list[object]) -> Iterator[None]:
    """Run on the arrays' library's current stream (CuPy's), where it has one."""
    cuda = [(a, i) for a in arrays if (i := _cuda_index(a)) is not None]
    cupy_arrays = [(a, i) for a, i in cuda if _library(a) == "cupy"]
    if not cupy_arrays:
        yield
        return
    import cupy  # the arrays are CuPy's, so it is there

    _, index = cupy_arrays[0]
    device = torch.device("cuda", index)
    with cupy.cuda.Device(index):
        ptr = int(cupy.cuda.get_current_stream().ptr)
    # 0 is the legacy default stream, which is torch's default stream too
    stream = torch.cuda.default_stream(device) if ptr == 0 else torch.cuda.ExternalStream(ptr, device=device)
    with torch.cuda.stream(stream):
        yield


def accepts_arrays(*outputs: str, name: str | None = None) -> Callable[[F], F]:
    """Let a drop-in call take DLPack arrays (and lists of them) wherever it takes
    tensors; `outputs` name the parameters results are written into, `name` the
    call in errors (default: the function's). Calls with tensors only go straight
    through."""

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        fn_name = name or fn.__name__

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not _has_array(args) and not (kwargs and _has_array(kwargs.values())):
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            arrays = [v for value in bound.arguments.values()
                      for v in (value if isinstance(value, (list, tuple)) else [value]) if is_array(v)]
            with caller_stream(arrays):
                for arg, value in bound.arguments.items():
                    out = arg in outputs
                    if isinstance(value, (list, tuple)) and any(is_array(v) for v in value):
                        bound.arguments[arg] = [as_tensor(v, f"{arg}[{i}]", fn_name, out)
                                                 for i, v in enumerate(value)]
                    elif is_array(value):
                        bound.arguments[arg] = as_tensor(value, arg, fn_name, out)
                return fn(*bound.args, **bound.kwargs)

        return call  # type: ignore[return-value]

    return wrap
