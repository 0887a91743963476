"""Processed outputs as bytes for a shared cache tier, without pickle: whoever can write to the
cache must not get code execution in every frontend that reads it.

Layout: b"LMV1", a 4-byte little-endian header length, a JSON header describing the value's
structure, then the raw buffers of its tensors, arrays and bytes, each at a 64-byte aligned
offset. The header holds plain values (None, bool, int, float, str) inline; containers
(dict, list, tuple; any Mapping comes back as a dict) recursively; tensors and arrays as dtype,
shape and a byte range. Reading checks every range, dtype and shape against the bytes, so a
corrupt or foreign value is a SerializationError (a cache miss), never a crash.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

MAGIC = b"LMV1"
_ALIGN = 64
MAX_DEPTH = 32
_NUMPY_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex64",
                 "complex128", "uint16", "uint32", "uint64")
_TORCH_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


class SerializationError(ValueError):
    """A value that cannot be written (an unsupported type) or read (corrupt, foreign)."""


def dumps(value) -> bytes:
    """The value as bytes; SerializationError for a type outside the layout above."""
    buffers: list[memoryview] = []
    size = [0]

    def place(buffer: memoryview) -> list[int]:
        start = -(-size[0] // _ALIGN) * _ALIGN
        if start > size[0]:
            buffers.append(memoryview(bytes(start - size[0])))
        buffers.append(buffer)
        size[0] = start + buffer.nbytes
        return [start, buffer.nbytes]

    def encode(item, depth: int):
        if depth > MAX_DEPTH:
            raise SerializationError("value nested too deeply")
        if item is None or isinstance(item, (bool, int, float, str)):
            return {"v": item}
        if isinstance(item, (bytes, bytearray, memoryview)):
            return {"b": place(memoryview(item).cast("B"))}
        if isinstance(item, np.ndarray):
            if item.dtype.name not in _NUMPY_DTYPES:
                raise SerializationError(f"numpy dtype {item.dtype} is not supported")
            array = np.ascontiguousarray(item)
            return {"a": array.dtype.name, "s": list(array.shape), "r": place(array.reshape(-1).view(np.uint8).data)}
        if type(item).__module__.startswith("torch") and hasattr(item, "untyped_storage"):
            import torch

            dtype = str(item.dtype).removeprefix("torch.")
            if dtype not in _TORCH_DTYPES:
                raise SerializationError(f"torch dtype {item.dtype} is not supported")
            tensor = item.detach().to("cpu").contiguous()
            raw = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
            return {"t": dtype, "s": list(tensor.shape), "r": place(raw.data)}
        if isinstance(item, Mapping):
            if all(isinstance(k, str) for k in item):
                return {"d": {k: encode(v, depth + 1) for k, v in item.items()}}
            return {"m": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in item.items()]}
        if isinstance(item, list):
            return {"l": [encode(v, depth + 1) for v in item]}
        if isinstance(item, tuple):
            return {"u": [encode(v, depth + 1) for v in item]}
        raise SerializationError(f"{type(item).__name__} values cannot be stored in the shared cache")

    header = json.dumps(encode(value, 0), separators=(",", ":")).encode()
    return b"".join([MAGIC, len(header).to_bytes(4, "little"), header, *buffers])


def loads(data: bytes | bytearray | memoryview):
    """The value back; SerializationError for anything that is not a well-formed value."""
    view = memoryview(data).cast("B")
    if view.nbytes < 8 or bytes(view[:4]) != MAGIC:
        raise SerializationError("not a lazymedia cache value")
    header_length = int.from_bytes(view[4:8], "little")
    if header_length > view.nbytes - 8:
        raise SerializationError("header runs past the value")
    try:
        tree = json.loads(bytes(view[8:8 + header_length]))
    except (ValueError, RecursionError) as exc:
        raise SerializationError(f"unreadable header: {type(exc).__name__}") from None
    payload = bytearray(view[8 + header_length:])  # one writable copy: tensors view it without copies

    def region(entry) -> tuple[int, int]:
        if not (isinstance(entry, list) and len(entry) == 2 and all(type(v) is int and v >= 0 for v in entry)):
            raise SerializationError("bad byte range")
        start, length = entry
        if start + length > len(payload):
            raise SerializationError("byte range runs past the value")
        return start, length

    def shape_of(entry, itemsize: int, length: int) -> tuple[int, ...]:
        if not (isinstance(entry, list) and all(type(v) is int and v >= 0 for v in entry)) or len(entry) > 32:
            raise SerializationError("bad shape")
        if int(np.prod(entry, dtype=object)) * itemsize != length:
            raise SerializationError("shape does not match the bytes")
        return tuple(entry)

    def decode(node, depth: int):
        if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) not in (1, 3):
            raise SerializationError("malformed value")
        if "v" in node:
            if node["v"] is not None and not isinstance(node["v"], (bool, int, float, str)):
                raise SerializationError("malformed plain value")
            return node["v"]
        if "b" in node:
            start, length = region(node["b"])
            return bytes(payload[start:start + length])
        if "a" in node:
            if node["a"] not in _NUMPY_DTYPES:
                raise SerializationError("bad numpy dtype")
            dtype = np.dtype(node["a"])
            start, length = region(node.get("r"))
            shape = shape_of(node.get("s"), dtype.itemsize, length)
            return np.frombuffer(payload, dtype=dtype, count=length // dtype.itemsize, offset=start).reshape(shape)
        if "t" in node:
            import torch

            if node["t"] not in _TORCH_DTYPES:
                raise SerializationError("bad torch dtype")
            dtype = getattr(torch, node["t"])
            itemsize = torch.empty((), dtype=dtype).element_size()
            start, length = region(node.get("r"))
            shape = shape_of(node.get("s"), itemsize, length)
            if length == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(payload, dtype=dtype, count=length // itemsize, offset=start).reshape(shape)
        if "d" in node and isinstance(node["d"], dict):
            return {k: decode(v, depth + 1) for k, v in node["d"].items()}
        if "m" in node and isinstance(node["m"], list):
            pairs = []
            for pair in node["m"]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise SerializationError("malformed mapping")
                pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
            try:
                return dict(pairs)
            except TypeError:
                raise SerializationError("unhashable mapping key") from None
        if "l" in node and isinstance(node["l"], list):
            return [decode(v, depth + 1) for v in node["l"]]
        if "u" in node and isinstance(node["u"], list):
            return tuple(decode(v, depth + 1) for v in node["u"])
        raise SerializationError("malformed value")

    return decode(tree, 0)
