"""Processed outputs as compact bytes for a shared cache tier, without pickle: whoever can write
to the cache must not get code execution in every frontend that reads it.

Layout (version 6): b"LMV6", a 4-byte little-endian header length, the 16-byte BLAKE3 digest
of the key the value was written under, a 16-byte BLAKE3 tag of the payload, a 16-byte BLAKE3 tag
of the key digest, payload tag and header (BLAKE3's keyed mode for both when a secret is set), a
JSON header describing the value's structure, then the payload: the buffers of its tensors,
arrays and bytes, each at a 64-byte aligned offset (from the value's start: a value read into a
64-byte aligned buffer, as torch allocates, is aligned for every dtype). A value read under another key, or without
the writer's secret, is refused: the key binds a value to what it is the value of, the secret to
who may write it. The two tags let a reader that trusts where the bytes lie (HostCache's value
files, see _host.py) check the header without reading the payload. The header holds
plain values (None, bool, int, float, str) inline; containers (dict, list, tuple; any Mapping
comes back as a dict) recursively; tensors and arrays as dtype, shape and how their elements are
stored, one encoding per tensor, exact unless asked otherwise:

- levels: a float tensor whose values take few distinct levels as uint8/uint16 codes plus tables
  of the levels' bit patterns, element i in table (i // run) % groups (header "g": [run, groups]).
  One table per channel where the shape shows one (a model's normalized pixels: at most 256 levels
  per channel, so uint8 codes, where one table for the tensor needs uint16), else one table. The
  native coder (`levels.encode`) numbers each element's exact bit pattern, so the round trip is
  bit for bit by construction; reading is one native gather (`levels.decode`) straight from the
  stored codes into the tensor, each code checked against its table's length. Where every run's
  second half repeats its first (header "e": the half's length), only the first halves' codes are
  stored and the gather writes each twice: a processor that tiles an image into two temporal
  frames (Qwen2-VL and its successors, GLM-4V: temporal_patch_size 2) makes half its output a
  copy, which the coder finds by comparing each run's halves as it codes the first (LZ4 found it
  too, in a pass over all the codes).
- lz4: the bytes (raw elements or codes) LZ4-compressed, where a trial on one slice says it pays.
- raw: the elements as they are.
- bfloat16 (only with `dumps(..., bfloat16=True)`, lossy): float32/float64 tensors without few
  levels stored as bfloat16 and widened back to their dtype when read.

`dumps(..., levels=False, compress=False)` is the layout for the read that copies nothing: every
buffer as it is, so `loads(..., zero_copy=True)` of a writable buffer (HostCache's private read
of a value file) returns tensors that are views of it.

Reading checks the key, the tags, every range, dtype, shape and size against the bytes and a bound
on what the value may expand to, so a corrupt, truncated, foreign or other-version value is a
SerializationError (a cache miss), never a crash or an unbounded allocation.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

import blake3
import lz4.block
import numpy as np
import numpy.typing as npt

from .. import levels as level_coder  # "levels" names a count here

if TYPE_CHECKING:
    import torch

MAGIC = b"LMV6"
_PREFIX = 4 + 4 + 16 + 16 + 16  # magic, header length, key digest, payload tag, header tag
# The environment variable a shared tier reads its MAC secret from (unset: an unkeyed digest).
SECRET_ENV = "LAZYMEDIA_CACHE_SECRET"
_MAC_CONTEXT = "lazymedia 2026-12 cache value MAC key"
_ALIGN = 64
MAX_DEPTH = 32
# What one value may expand to when read, unless the reader says otherwise.
MAX_VALUE_BYTES = 4 << 30
_NUMPY_DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
)
_TORCH_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
_FLOATS = ("float16", "bfloat16", "float32", "float64")
# An element's size -> the integer type of its bit pattern.
_BITS: dict[int, type[np.unsignedinteger[Any]]] = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# Level coding: tensors smaller than this stay raw; one table holds at most MAX_LEVELS levels ("a
# few thousand"), else the tensor is not level-like.
_LEVEL_MIN_ELEMENTS = 1 << 14
MAX_LEVELS = 4096
# Compression: tried on buffers of at least _COMPRESS_MIN bytes, kept if a _TRIAL_BYTES slice
# shrinks below _COMPRESS_GAIN of its size. LZ4 takes at most 0x7E000000 bytes in one block; its
# acceleration 4 halves the time of 1 on a 720p output's level codes for the same size (51 %).
_COMPRESS_MIN = 64 << 10
_TRIAL_BYTES = 256 << 10
_COMPRESS_GAIN = 0.8
_LZ4_MAX = 0x7E000000
_LZ4_ACCELERATION = 4

Bytes = npt.NDArray[np.uint8]


# -- the header's schema ----------------------------------------------------------------------------
# The JSON header is one node per value: a dict whose one-letter keys say what the value is (the
# kind's key) and how its bytes are stored. Byte ranges are [start, length] in the payload.
class PlainNode(TypedDict):
    v: None | bool | int | float | str  # the value itself


class BytesNode(TypedDict):
    b: list[int]  # the bytes' range


class ElementsNode(TypedDict, total=False):
    """A numpy array ("a") or torch tensor ("t"), one encoding of its elements' range "r":
    raw, level codes ("k", "c", "g", "e"), bfloat16 ("h"), each maybe LZ4 ("z", "n")."""

    a: str  # a numpy dtype's name
    t: str  # a torch dtype's name
    s: list[int]  # shape
    k: list[int]  # levels: the tables' range (groups x levels bit patterns, padded with zeros)
    c: str  # levels: the codes' dtype, uint8 or uint16
    g: list[int]  # levels: [run, groups]: element i is in table (i // run) % groups
    e: int  # levels: each block of 2 * e elements repeats its first half; "r" holds the first halves' codes
    h: str  # lossy: "bfloat16", the elements stored as bfloat16
    z: str  # "r" compressed: "lz4"
    n: int  # "r" compressed: its length unpacked
    r: list[int]  # the elements' (or codes') range


class DictNode(TypedDict):
    d: dict[str, Node]  # a mapping whose keys are all str


class MappingNode(TypedDict):
    m: list[list[Node]]  # any other mapping: [[key, value], ...]


class ListNode(TypedDict):
    l: list[Node]  # noqa: E741  # the format's key


class TupleNode(TypedDict):
    u: list[Node]


Node: TypeAlias = PlainNode | BytesNode | ElementsNode | DictNode | MappingNode | ListNode | TupleNode


def _empty(count: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    """A new 1-d array for a value's elements, allocated by torch in plain pages: numpy asks the
    kernel for transparent huge pages from 4 MiB, and where finding them stalls, the first write
    of a new array does (benchmarks/bench_shared_cache.py, "new memory" in a fresh process by
    torch and by numpy: 5.2 and 143 ms for 21.5 MB, 48 and 767 ms for 172 MB in one run)."""
    import torch

    element = np.dtype(dtype)
    return torch.empty(count * element.itemsize, dtype=torch.uint8).numpy().view(element)


# Level codes of up to this many bytes are coded in a buffer each thread keeps (see _CodeBuffer).
_CODE_BUFFER_MAX = 64 << 20


class _CodeBuffer(threading.local):
    """This thread's buffer for level codes (a 720p output's 2.8 MB: on a VM that backs memory
    lazily, a new buffer's first writes cost a good part of the coding). Codes stored as they
    lie lend the buffer to the value's parts (`take`) until their writer is done with them
    (`recycle`); meanwhile the thread's next value codes into a new one."""

    buffer: Bytes | None = None
    lent: Bytes | None = None

    def get(self, nbytes: int) -> Bytes:
        if nbytes > _CODE_BUFFER_MAX:
            return _empty(nbytes, np.uint8)
        if self.buffer is None or self.buffer.nbytes < nbytes:
            self.buffer = _empty(nbytes, np.uint8)
        return self.buffer[:nbytes]

    def take(self, codes: npt.NDArray[Any]) -> None:
        """`codes` are stored as they lie: the buffer they are a view of is lent to them."""
        if self.buffer is not None and np.may_share_memory(codes, self.buffer):
            self.lent, self.buffer = self.buffer, None

    def recycle(self, parts: list[Any]) -> None:
        """The buffer lent to `parts` is this thread's again, where they hold it."""
        lent = self.lent
        if (
            lent is not None
            and self.buffer is None
            and any(
                isinstance(part, memoryview) and np.may_share_memory(np.frombuffer(part, np.uint8), lent)
                for part in parts
            )
        ):
            self.buffer, self.lent = lent, None


_CODES = _CodeBuffer()


def recycle(encoded: object) -> None:
    """Tells serialize that whoever wrote `encoded` (`dump_parts`' buffers, or a tuple of such
    lists and bytes, as `TieredCache.encode` makes) is done with them and holds no view of them:
    a code buffer they borrowed from this thread is then reused for its next value."""
    if isinstance(encoded, tuple):
        for data in encoded:
            recycle(data)
    elif isinstance(encoded, list):
        _CODES.recycle(encoded)


class SerializationError(ValueError):
    """A value that cannot be written (an unsupported type) or read (corrupt, foreign)."""


def key_digest(key: str) -> bytes:
    """The 16 bytes that bind a value to the key it is stored under."""
    return blake3.blake3(key.encode()).digest(16)


def mac_key(secret: str | bytes | None) -> bytes | None:
    """The 32-byte BLAKE3 key derived from a secret (None or empty: no MAC, an unkeyed digest)."""
    if not secret:
        return None
    raw = secret.encode() if isinstance(secret, str) else secret
    return blake3.blake3(raw, derive_key_context=_MAC_CONTEXT).digest()


def _tagger(key: bytes | None) -> blake3.blake3:
    return blake3.blake3(key=key) if key is not None else blake3.blake3()


class BadValueLog:
    """Logs bad values read from a tier at most once per `every_s` (with how many were not
    logged), so a flood of garbage cannot flood the log."""

    def __init__(self, every_s: float = 10.0, logger: logging.Logger | None = None):
        self.every_s = every_s
        self._logger = logger or logging.getLogger("lazymedia.cache")
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._quiet = 0

    def report(self, tier: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.every_s:
                self._quiet += 1
                return
            self._last, quiet, self._quiet = now, self._quiet, 0
        self._logger.warning(
            "%s cache: unreadable value treated as a miss (%s)%s",
            tier,
            exc,
            f"; {quiet} more since the last report" if quiet else "",
        )


# -- writing --------------------------------------------------------------------------------------
def _groupings(shape: tuple[int, ...], count: int) -> list[tuple[int, int, int]]:
    """(run, groups, levels) to try, in order: element i in table (i // run) % groups of at most
    `levels` entries. Per channel first, with uint8 codes (a model's normalized pixels have at most
    256 levels per channel, not per tensor): a channel dimension of 2-4 (NCHW, [frames, C, H, W]),
    or the channel-major patches of Qwen2-VL-style processors ([patches, C*T*P*P], channel of
    element i: (i // (T*P*P)) % C, with C = 3); then one table, uint8 codes, then uint16."""
    channel = [(math.prod(shape[d + 1 :]), size, 256) for d, size in enumerate(shape) if 2 <= size <= 4]
    if len(shape) == 2 and shape[-1] % 3 == 0:
        channel.append((shape[-1] // 3, 3, 256))
    return [g for g in channel if g[0] > 0] + [(count, 1, 256), (count, 1, MAX_LEVELS)]


def _level_code(
    bits: npt.NDArray[Any], shape: tuple[int, ...]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any], int, int, int] | None:
    """(tables, codes, run, groups, half) with tables[(i // run) % groups, codes[i]] == bits[i] bit
    for bit (the tables padded with zeros to one length; with `half`, every block of 2 * half
    elements repeats its first half and the codes are the first halves'), or None when no grouping
    fits or coding would not make the tensor smaller. Each try is one native pass (on the kernel
    threads) that stops at the first group with too many levels or block with unequal halves (a
    tensor that is not level-like stops within a few hundred elements)."""
    if bits.size < _LEVEL_MIN_ELEMENTS:
        return None
    for run, groups, levels in _groupings(shape, bits.size):
        code_type = np.dtype(np.uint8 if levels <= 256 else np.uint16)
        if code_type.itemsize >= bits.itemsize:
            continue
        # Codes in one run share a table: a run of two equal halves (a processor that tiles an image
        # twice) needs only its first half's.
        halves = (run // 2, 0) if run % 2 == 0 and bits.size % run == 0 else (0,)
        for half in halves:
            count = bits.size // 2 if half else bits.size
            codes = _CODES.get(count * code_type.itemsize).view(code_type)
            tables = np.zeros((groups, levels), bits.dtype)
            counts = level_coder.encode(bits, run, groups, levels, codes, tables.reshape(-1), half)
            if counts is not None:
                return np.ascontiguousarray(tables[:, : max(max(counts), 1)]), codes, run, groups, half
    return None


def _maybe_compress(buffer: memoryview) -> tuple[memoryview, ElementsNode]:
    """The buffer LZ4-compressed with the header fields that say so, where a trial slice says it
    pays; else the buffer as it is."""
    size = buffer.nbytes
    if size < _COMPRESS_MIN or size > _LZ4_MAX:
        return buffer, {}
    middle = (size - min(size, _TRIAL_BYTES)) // 2
    trial = buffer[middle : middle + _TRIAL_BYTES]
    if len(lz4.block.compress(trial, store_size=False, acceleration=_LZ4_ACCELERATION)) > _COMPRESS_GAIN * trial.nbytes:
        return buffer, {}
    packed = lz4.block.compress(buffer, store_size=False, acceleration=_LZ4_ACCELERATION)
    if len(packed) > _COMPRESS_GAIN * size:
        return buffer, {}
    return memoryview(packed), {"z": "lz4", "n": size}


class _Writer:
    """One value's header nodes and the payload's buffers, each placed at an aligned offset."""

    def __init__(self, levels: bool, compress: bool, bfloat16: bool):
        self.levels, self.compress, self.bfloat16 = levels, compress, bfloat16
        self.buffers: list[memoryview] = []
        self.size = 0

    def place(self, buffer: memoryview) -> list[int]:
        """Appends `buffer` (after padding to the next aligned offset): its range."""
        start = -(-self.size // _ALIGN) * _ALIGN
        if start > self.size:
            self.buffers.append(memoryview(bytes(start - self.size)))
        self.buffers.append(buffer)
        self.size = start + buffer.nbytes
        return [start, buffer.nbytes]

    def node(self, item: object, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise SerializationError("value nested too deeply")
        if item is None or isinstance(item, (bool, int, float, str)):
            return {"v": item}
        if isinstance(item, (bytes, bytearray, memoryview)):
            return {"b": self.place(memoryview(item).cast("B"))}
        if isinstance(item, np.ndarray):
            return self.array(item)
        if type(item).__module__.startswith("torch") and hasattr(item, "untyped_storage"):
            return self.tensor(item)  # type: ignore[arg-type]  # a torch.Tensor (its subclasses included)
        if isinstance(item, Mapping):
            if all(isinstance(k, str) for k in item):
                return {"d": {k: self.node(v, depth + 1) for k, v in item.items()}}
            return {"m": [[self.node(k, depth + 1), self.node(v, depth + 1)] for k, v in item.items()]}
        if isinstance(item, list):
            return {"l": [self.node(v, depth + 1) for v in item]}
        if isinstance(item, tuple):
            return {"u": [self.node(v, depth + 1) for v in item]}
        raise SerializationError(f"{type(item).__name__} values cannot be stored in the shared cache")

    def array(self, item: npt.NDArray[Any]) -> ElementsNode:
        if item.dtype.name not in _NUMPY_DTYPES:
            raise SerializationError(f"numpy dtype {item.dtype} is not supported")
        array = np.ascontiguousarray(item)
        return self.elements(
            {"a": array.dtype.name, "s": list(array.shape)}, array.reshape(-1), array.dtype.name in _FLOATS, False
        )

    def tensor(self, item: torch.Tensor) -> ElementsNode:
        import torch

        dtype = str(item.dtype).removeprefix("torch.")
        if dtype not in _TORCH_DTYPES:
            raise SerializationError(f"torch dtype {item.dtype} is not supported")
        tensor = item.detach().to("cpu").contiguous().reshape(-1)
        flat = tensor.view(torch.uint8).numpy() if tensor.numel() else np.empty(0, np.uint8)
        if tensor.element_size() in _BITS:
            flat = flat.view(_BITS[tensor.element_size()])
        return self.elements(
            {"t": dtype, "s": list(item.shape)},
            flat,
            dtype in _FLOATS,
            self.bfloat16 and dtype in ("float32", "float64"),
        )

    def elements(self, node: ElementsNode, flat: npt.NDArray[Any], is_float: bool, lossy: bool) -> ElementsNode:
        """Fills the node's storage fields for a contiguous 1-d array of the elements."""
        coded = (
            _level_code(flat.view(_BITS[flat.itemsize]), tuple(node["s"]))
            if self.levels and is_float and flat.itemsize in _BITS
            else None
        )
        if coded is not None:
            tables, codes, run, groups, half = coded
            node["k"] = self.place(tables.view(np.uint8).reshape(-1).data)
            node["c"] = codes.dtype.name
            node["g"] = [run, groups]
            if half:
                node["e"] = half
            flat = codes
        elif lossy:
            import torch

            node["h"] = "bfloat16"
            width = flat.itemsize * 8
            floats = torch.from_numpy(flat.view(f"int{width}")).view(getattr(torch, f"float{width}"))
            flat = floats.to(torch.bfloat16).view(torch.int16).numpy()
        raw = np.ascontiguousarray(flat).view(np.uint8).data
        data, fields = _maybe_compress(raw) if self.compress else (raw, {})
        if data is raw:
            _CODES.take(flat)
        node.update(fields)
        node["r"] = self.place(data)
        return node


def dumps(
    value: object,
    *,
    key: str = "",
    mac: bytes | None = None,
    bfloat16: bool = False,
    compress: bool = True,
    levels: bool = True,
) -> bytes:
    """The value as bytes bound to `key` (and tagged with `mac`, a `mac_key`); SerializationError
    for a type outside the layout above. Exact unless `bfloat16` (float32/float64 tensors that
    are not level-coded lose precision). `compress=False` stores every buffer without LZ4 (larger,
    no LZ4 on the read); `levels=False` without level codes (with both: the zero-copy layout)."""
    parts = dump_parts(value, key=key, mac=mac, bfloat16=bfloat16, compress=compress, levels=levels)
    joined = b"".join(parts)
    recycle(parts)
    return joined


def dump_parts(
    value: object,
    *,
    key: str = "",
    mac: bytes | None = None,
    bfloat16: bool = False,
    compress: bool = True,
    levels: bool = True,
    tag_payload: bool = True,
    tag_below: int = 0,
) -> list[bytes | memoryview]:
    """`dumps` as the buffers it joins, for a writer that writes them where they go with no copy
    in between: buffers stored as they are are views of the value's own tensors and arrays (the
    value must not change until they are written). `tag_payload=False` leaves the payload tag
    zero (no pass over the payload; a reader must then pass `verify_payload=False`) for payloads
    of at least `tag_below` bytes (smaller ones are tagged: cheap, and readable by any reader).
    A writer done with the buffers hands them to `recycle` (none of them may be read after)."""
    writer = _Writer(levels, compress, bfloat16)
    header = json.dumps(writer.node(value, 0), separators=(",", ":")).encode()
    header += b" " * (-(_PREFIX + len(header)) % _ALIGN)  # the payload starts aligned where the value does
    bound = key_digest(key)
    payload_tag = bytes(16)
    if tag_payload or writer.size < tag_below:
        payload_tagger = _tagger(mac)
        for buffer in writer.buffers:
            payload_tagger.update(buffer)
        payload_tag = payload_tagger.digest(16)
    header_tag = _tagger(mac).update(bound).update(payload_tag).update(header).digest(16)
    return [MAGIC, len(header).to_bytes(4, "little"), bound, payload_tag, header_tag, header, *writer.buffers]


# -- reading --------------------------------------------------------------------------------------
def loads(
    data: bytes | bytearray | memoryview | npt.NDArray[Any],
    *,
    key: str = "",
    mac: bytes | None = None,
    max_bytes: int = MAX_VALUE_BYTES,
    zero_copy: bool = False,
    verify_payload: bool = True,
) -> Any:
    """The value back; SerializationError for anything that is not a well-formed value of this
    version written under `key` with the same `mac` key, or one that would expand past
    `max_bytes`. Tensors and arrays own their memory (the input may be a view that dies after
    this call: a memory map's page), except with `zero_copy` and a writable input: buffers stored
    as they are (no LZ4, no level codes) are then views of `data`, which they keep alive.
    `verify_payload=False` checks the header's tag but not the payload's (for bytes whose place
    the caller trusts: the payload is then not read here at all)."""
    view = (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
    tree, payload = _checked_header(view, key, mac, verify_payload)
    reader = _Reader(payload, max_bytes, shared=zero_copy and not view.readonly)
    try:
        return reader.walk(tree, 0)
    except (TypeError, ValueError, OverflowError, KeyError, IndexError, RuntimeError) as exc:
        if isinstance(exc, SerializationError):
            raise
        raise SerializationError(f"malformed value: {type(exc).__name__}") from None


def _checked_header(view: memoryview, key: str, mac: bytes | None, verify_payload: bool) -> tuple[object, memoryview]:
    """(the header's node tree, the payload) of a value whose prefix, key binding and tags hold."""
    if view.nbytes < _PREFIX or bytes(view[:4]) != MAGIC:
        raise SerializationError("not a lazymedia cache value of this version")
    header_length = int.from_bytes(view[4:8], "little")
    if header_length > view.nbytes - _PREFIX:
        raise SerializationError("header runs past the value")
    if bytes(view[8:24]) != key_digest(key):
        raise SerializationError("value written under another key")
    header = view[_PREFIX : _PREFIX + header_length]
    if _tagger(mac).update(view[8:24]).update(view[24:40]).update(header).digest(16) != bytes(view[40:_PREFIX]):
        raise SerializationError("tag mismatch (truncated, damaged, or written without this tier's secret)")
    payload = view[_PREFIX + header_length :]
    if verify_payload and _tagger(mac).update(payload).digest(16) != bytes(view[24:40]):
        raise SerializationError("payload tag mismatch (truncated or damaged)")
    try:
        return json.loads(bytes(header)), payload
    except (ValueError, RecursionError) as exc:
        raise SerializationError(f"unreadable header: {type(exc).__name__}") from None


def _count_of(shape: object) -> int:
    if not (isinstance(shape, list) and all(type(v) is int and v >= 0 for v in shape)) or len(shape) > 32:
        raise SerializationError("bad shape")
    return int(np.prod(shape, dtype=object))


class _Reader:
    """One value's read from its payload. The nodes are untrusted: every field is checked before
    it is used, and what the value expands to is spent from `max_bytes`. An object, not closures:
    closures that call each other form a reference cycle that holds the payload (HostCache's
    pooled read buffer) until the garbage collector runs, so every hit would take a new buffer."""

    def __init__(self, payload: memoryview, max_bytes: int, shared: bool):
        self.payload, self.budget, self.shared = payload, max_bytes, shared

    def spend(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise SerializationError("value expands past the reader's bound")

    def region(self, entry: object) -> memoryview:
        if not (isinstance(entry, list) and len(entry) == 2 and all(type(v) is int and v >= 0 for v in entry)):
            raise SerializationError("bad byte range")
        start, length = entry
        if start + length > self.payload.nbytes:
            raise SerializationError("byte range runs past the value")
        return self.payload[start : start + length]

    def walk(self, node: object, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(node, dict) or not 1 <= len(node) <= 9:
            raise SerializationError("malformed value")
        if "v" in node:
            if node["v"] is not None and not isinstance(node["v"], (bool, int, float, str)):
                raise SerializationError("malformed plain value")
            return node["v"]
        if "b" in node:
            self.spend(len(self.region(node["b"])))
            return bytes(self.region(node["b"]))
        if "a" in node:
            return self.array(node)
        if "t" in node:
            return self.tensor(node)
        if "d" in node and isinstance(node["d"], dict):
            return {k: self.walk(v, depth + 1) for k, v in node["d"].items()}
        if "m" in node and isinstance(node["m"], list):
            return self.mapping(node["m"], depth)
        if "l" in node and isinstance(node["l"], list):
            return [self.walk(v, depth + 1) for v in node["l"]]
        if "u" in node and isinstance(node["u"], list):
            return tuple(self.walk(v, depth + 1) for v in node["u"])
        raise SerializationError("malformed value")

    def mapping(self, pairs: list[object], depth: int) -> dict[Any, Any]:
        items = []
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise SerializationError("malformed mapping")
            items.append((self.walk(pair[0], depth + 1), self.walk(pair[1], depth + 1)))
        try:
            return dict(items)
        except TypeError:
            raise SerializationError("unhashable mapping key") from None

    def array(self, node: dict[str, Any]) -> npt.NDArray[Any]:
        if node["a"] not in _NUMPY_DTYPES or "h" in node:
            raise SerializationError("bad numpy dtype")
        dtype = np.dtype(node["a"])
        flat, _ = self.elements(node, dtype.itemsize)
        array: npt.NDArray[Any] = flat.view(dtype).reshape(tuple(node["s"]))
        return array

    def tensor(self, node: dict[str, Any]) -> torch.Tensor:
        import torch

        if node["t"] not in _TORCH_DTYPES:
            raise SerializationError("bad torch dtype")
        dtype = getattr(torch, node["t"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        flat, widen = self.elements(node, itemsize)
        shape = tuple(node["s"])
        if widen:
            if node["t"] not in ("float32", "float64"):
                raise SerializationError("bad lossy encoding")
            return torch.from_numpy(flat.view(np.int16)).view(torch.bfloat16).to(dtype).reshape(shape)
        if flat.size == 0:
            return torch.empty(shape, dtype=dtype)
        signed = flat.view(np.uint8) if flat.dtype == np.uint8 else flat.view(f"int{itemsize * 8}")
        return torch.from_numpy(signed).view(dtype).reshape(shape)

    def elements(self, node: dict[str, Any], itemsize: int) -> tuple[npt.NDArray[Any], bool]:
        """(the elements as a 1-d uint8 array or bit-pattern array, whether widened from bfloat16)."""
        count = _count_of(node.get("s"))
        if "k" in node:
            return self.level_decoded(node, count, itemsize), False
        if node.get("h") == "bfloat16":
            self.spend(count * itemsize)  # the widened copy
            return np.frombuffer(self.stored(node, count * 2), np.uint16), True
        if "h" in node:
            raise SerializationError("bad lossy encoding")
        flat = np.frombuffer(self.stored(node, count * itemsize), np.uint8)
        if self.shared and flat.ctypes.data % itemsize:  # a view the tensor could not use: a copy
            flat = flat.copy()
        return flat, False

    def level_decoded(self, node: dict[str, Any], count: int, itemsize: int) -> npt.NDArray[Any]:
        """The bit patterns of a level-coded node, gathered from its codes and tables."""
        grouping = node.get("g")
        if (
            node.get("c") not in ("uint8", "uint16")
            or itemsize not in _BITS
            or not isinstance(grouping, list)
            or len(grouping) != 2
            or not all(type(v) is int and v > 0 for v in grouping)
            or grouping[0] > max(count, 1)
            or count == 0
        ):
            raise SerializationError("bad level coding")
        run, groups = grouping
        half = node.get("e", 0)
        if type(half) is not int or half < 0 or (half and (run % (2 * half) or count % (2 * half))):
            raise SerializationError("bad repeated half")
        code_type = np.dtype(node["c"])
        stored_count = count // 2 if half else count
        codes = np.frombuffer(self.stored(node, stored_count * code_type.itemsize, copy=False), code_type)
        if not codes.flags.aligned:  # wherever the value lies (a memory map's page): the gather reads aligned
            codes = codes.copy()
        table_bytes = self.region(node["k"])
        entries = table_bytes.nbytes // itemsize
        if table_bytes.nbytes % itemsize or entries == 0 or entries % groups or entries // groups > 1 << 16:
            raise SerializationError("bad level table")
        self.spend(count * itemsize)
        table = np.frombuffer(bytes(table_bytes), _BITS[itemsize])  # a copy: aligned wherever the value lies
        out = _empty(count, table.dtype)
        if not level_coder.decode(codes, run, groups, table, out, half):
            raise SerializationError("level code past its table")
        return out

    def stored(self, node: dict[str, Any], nbytes: int, copy: bool = True) -> bytearray | memoryview:
        """A writable copy of exactly `nbytes` of the node's elements ("r"), decompressed if need
        be; with `copy=False` (codes, read once by the gather that builds the tensor) or a
        zero-copy read, the stored bytes themselves where they need no decompression."""
        copy = copy and not self.shared
        self.spend(nbytes)
        raw = self.region(node.get("r"))
        if node.get("z") is None:
            if raw.nbytes != nbytes:
                raise SerializationError("shape does not match the bytes")
            return bytearray(raw) if copy else raw
        if node["z"] != "lz4" or node.get("n") != nbytes or nbytes > _LZ4_MAX:
            raise SerializationError("bad compression fields")
        try:
            unpacked = lz4.block.decompress(raw, uncompressed_size=nbytes, return_bytearray=True)
        except lz4.block.LZ4BlockError:
            raise SerializationError("corrupt compressed data") from None
        if len(unpacked) != nbytes:
            raise SerializationError("compressed data has the wrong size")
        return unpacked  # type: ignore[no-any-return, unused-ignore]  # lz4 has no stubs: a bytearray (return_bytearray)
