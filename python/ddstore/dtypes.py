"""The element types ddstore knows, and turning numpy arrays and CPU torch
tensors into numpy views without copying. The names and their sizes are Go's
(internal/layout), pinned by the shared vectors' "dtypes"."""

import numpy as np

from ._errors import BadBuffer

NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
         "float16", "bfloat16", "float32", "float64")


_CACHE = {}


def dtype_name(dtype):
    """The ddstore name of a numpy dtype, a torch dtype, or a name."""
    try:
        return _CACHE[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        _CACHE[dtype] = name
    except TypeError:
        pass
    return name


def _dtype_name(dtype):
    if isinstance(dtype, np.dtype):
        d = dtype
    elif isinstance(dtype, type) and issubclass(dtype, np.generic):  # np.float32, ...
        d = np.dtype(dtype)
    else:
        s = str(dtype)
        if s.startswith("torch."):
            s = s[len("torch."):]
        if s == "bfloat16":
            return s
        try:
            d = np.dtype(s)
        except (TypeError, ValueError, SyntaxError):  # numpy parses some strings as Python
            raise BadBuffer(f"ddstore: bad buffer: element type {dtype!r}: want one of {', '.join(NAMES)}") from None
    if d.names is not None or d.subdtype is not None:
        raise BadBuffer(f"ddstore: bad buffer: element type {d} (numpy structured records): want one of "
                        f"{', '.join(NAMES)}: add records as their bytes (a.view(np.uint8)), or through "
                        f"ddstore.torch.DistDataset, which keeps their layout")
    if d.name not in NAMES or d.byteorder == ">":
        raise BadBuffer(f"ddstore: bad buffer: element type {d}: want one of {', '.join(NAMES)} (native byte order)")
    return d.name


def as_array(x):
    """(numpy view of x, dtype name): a numpy array as it is, a CPU torch
    tensor through .numpy() (bfloat16 through an int16 view), sharing
    memory so that reads land in x itself."""
    if isinstance(x, np.ndarray):
        return x, dtype_name(x.dtype)
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch
        if x.device.type != "cpu":
            raise BadBuffer(f"ddstore: bad buffer: a tensor on {x.device}: want a CPU tensor")
        if x.dtype == torch.bfloat16:
            return x.detach().view(torch.int16).numpy(), "bfloat16"
        return x.detach().numpy(), dtype_name(x.dtype)
    a = np.asarray(x)
    return a, dtype_name(a.dtype)


def as_destination(x):
    """as_array of a destination rows are read into: it must be memory the
    caller sees written, a numpy array, a CPU tensor or a writable object
    with the buffer protocol (a bytearray, an array.array, a memoryview);
    never a copy made here (a list would be read into and stay unfilled)."""
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("torch"):
        a, dt = as_array(x)
    else:
        try:
            m = memoryview(x)
        except TypeError:
            raise BadBuffer(f"ddstore: bad buffer: a destination of type {type(x).__name__}: want a writable buffer "
                            f"(a numpy array, a CPU tensor, or an object with the buffer protocol)") from None
        a = np.asarray(m)
        dt = dtype_name(a.dtype)
    if not a.flags.writeable:
        raise BadBuffer(f"ddstore: bad buffer: a read-only destination of type {type(x).__name__}: want a writable "
                        f"buffer")
    return a, dt


def numpy_dtype(name):
    """The numpy dtype that holds items of a ddstore type (int16 for bfloat16)."""
    return np.dtype("int16" if name == "bfloat16" else name)


def itemsize(name):
    """The size of one item of a ddstore type."""
    return numpy_dtype(name).itemsize
