"""Cache values as bytes without pickle: every supported type round-trips, and any damage reads
as a SerializationError (a miss), never as an untyped error or code that runs."""

import gc
import pickle
import random

import blake3
import numpy as np
import pytest
import torch

from lazymedia import _C
from lazymedia.cache._serialize import MAGIC, SerializationError, dumps, key_digest, loads, mac_key


def sample_value():
    return {
        "pixel_values": torch.randn(6, 5),
        "half": torch.ones(3, dtype=torch.bfloat16),
        "grid": torch.tensor([[1, 4, 4]]),
        "mask": np.array([True, False]),
        "array": np.arange(12.0).reshape(3, 4),
        "empty": torch.empty(0, 7),
        "scalar": torch.tensor(3.5),
        "plain": [1, 2.5, None, "x", True],
        "tuple": (b"raw", {"nested": [np.int64(7).item()]}),
        7: "integer key",
    }


def test_round_trip_keeps_types_values_and_shapes():
    value = sample_value()
    back = loads(dumps(value))
    for name in ("pixel_values", "half", "grid", "empty", "scalar"):
        assert back[name].dtype == value[name].dtype and torch.equal(back[name], value[name])
    np.testing.assert_array_equal(back["array"], value["array"])
    assert back["mask"].dtype == bool and back["plain"] == value["plain"] and back["tuple"] == value["tuple"]
    assert back[7] == "integer key"
    back["pixel_values"] += 1  # tensors read back are writable (their own copy of the bytes)


def test_non_contiguous_and_gpu_free_inputs():
    view = torch.arange(24).reshape(4, 6)[:, ::2]
    assert torch.equal(loads(dumps({"v": view}))["v"], view)


@pytest.mark.parametrize(
    "value", [object(), {1.5j}, [lambda: 0], torch.zeros(2, dtype=torch.complex64), np.array(["text"])]
)
def test_unsupported_types_are_refused_on_write(value):
    with pytest.raises(SerializationError):
        dumps(value)


def test_pickles_and_foreign_bytes_are_refused():
    for data in (
        pickle.dumps({"x": 1}),
        b"",
        b"LMV2",
        b"LMV2\xff\xff\xff\xff{}",
        b"LMV2\x02\x00\x00\x00[]",
        b"LMV1" + dumps({"x": 1})[4:],
    ):
        with pytest.raises(SerializationError):
            loads(data)


def test_random_damage_is_a_serialization_error():
    data = dumps(sample_value())
    rng = random.Random(5)
    for _ in range(3000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            if not damaged:
                break
            at = rng.randrange(len(damaged))
            kind = rng.randrange(3)
            if kind == 0:
                damaged[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                del damaged[at:]
            else:
                damaged[at:at] = rng.randbytes(rng.randint(1, 16))
        if bytes(damaged) != data:
            with pytest.raises(SerializationError):
                loads(bytes(damaged))


def test_deep_nesting_is_bounded():
    value = []
    for _ in range(40):
        value = [value]
    with pytest.raises(SerializationError):
        dumps(value)
    header = b"[" * 100000 + b"]" * 100000
    with pytest.raises(SerializationError, match="unreadable header"):
        loads(sealed(header, b""))


PREFIX = 56  # magic, header length, key digest, payload tag, header tag


def sealed(header: bytes, payload: bytes, key: str = "") -> bytes:
    """A well-tagged value of this version around any header and payload (what a writer without
    a secret can produce)."""
    bound = key_digest(key)
    payload_tag = blake3.blake3(payload).digest(16)
    header_tag = blake3.blake3(bound + payload_tag + header).digest(16)
    return MAGIC + len(header).to_bytes(4, "little") + bound + payload_tag + header_tag + header + payload


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(b.contiguous().view(torch.uint8).numpy())
    )


def header_of(data: bytes) -> dict:
    import json

    return json.loads(data[PREFIX : PREFIX + int.from_bytes(data[4:8], "little")])


# Bit patterns a float32 level table must keep apart or carry as they are: NaN payloads (quiet,
# signalling, negative), -0.0 next to 0.0, denormals, infinities.
ADVERSARIAL_F32 = [
    0x7FC00001,
    0x7F800001,
    0xFFC00000,
    0x7FFFFFFF,
    0x80000000,
    0x00000000,
    0x00000001,
    0x807FFFFF,
    0x7F800000,
    0xFF800000,
]


def normalized_pixels(shape, channel_dim: int, levels: int = 246, dtype=torch.float32, seed=0) -> torch.Tensor:
    """uint8-like pixels normalized per channel along `channel_dim`, as a processor does: at most
    `levels` levels per channel, up to 3x that in the tensor (246: with the 10 ADVERSARIAL_F32
    patterns written in, channel 0 fills its uint8 table exactly)."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, levels, shape, generator=generator).to(torch.float32) / 255
    view = [1] * len(shape)
    view[channel_dim] = shape[channel_dim]
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073, 0.5])[: shape[channel_dim]].reshape(view)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711, 0.25])[: shape[channel_dim]].reshape(view)
    return ((pixels - mean) / std).to(dtype)


def qwen_patches(patches: int = 64, levels: int = 246, seed=0) -> torch.Tensor:
    """Qwen2-VL's layout: [patches, C*T*P*P] with C = 3, T = 2, P = 14, channel-major."""
    return normalized_pixels((patches, 3, 2 * 14 * 14), 1, levels, seed=seed).reshape(patches, 3 * 2 * 14 * 14)


def levels_tensor(levels: int, shape=(512, 300), dtype=torch.float32, seed=0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(levels, generator=generator, dtype=torch.float64).to(dtype)
    return table[torch.randint(0, levels, shape, generator=generator)]


def test_qwen2_vl_output_is_exact_and_at_most_6_mb():
    transformers = pytest.importorskip("transformers")
    import simplejpeg

    from lazymedia import synthetic

    processor = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    image = simplejpeg.decode_jpeg(synthetic.jpeg(720, 1280))
    output = processor()(images=[image], return_tensors="pt")
    value = {"pixel_values": output["pixel_values"], "image_grid_thw": output["image_grid_thw"]}
    assert value["pixel_values"].shape == (4784, 1176) and value["pixel_values"].dtype == torch.float32
    data = dumps(value)
    assert len(data) <= 3 << 20, len(data)  # uint8 codes, one table per channel, LZ4
    node = header_of(data)["d"]["pixel_values"]
    assert node["c"] == "uint8" and node["g"] == [392, 3]  # channel of element i: (i // (T*P*P)) % C
    assert node["e"] == 196  # an image is tiled into T = 2 equal frames: half the codes are stored
    for stored in (data, dumps(value, compress=False)):
        back = loads(stored)
        assert bit_equal(back["pixel_values"], value["pixel_values"])
        assert torch.equal(back["image_grid_thw"], value["image_grid_thw"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_few_levels_are_coded_exactly(dtype):
    value = levels_tensor(200, dtype=dtype)
    value[7, 7] = -0.0  # bit patterns, not float equality: -0.0 and 0.0 stay apart
    value[9, 9] = 0.0
    data = dumps(value)
    assert len(data) < value.numel() * 1.1 + 4096  # one byte per element (uint8 codes), not itemsize
    assert bit_equal(loads(data), value)


def test_rare_levels_are_coded():
    value = levels_tensor(300, shape=(1 << 18,))
    value[12345] = 123.456  # one rare level (a sampling coder would skip it)
    value[200001] = float("nan")
    data = dumps(value)
    assert len(data) < value.numel() * 2.1 + 4096  # still coded (uint16)
    assert bit_equal(loads(data), value)


def test_many_levels_stay_raw_and_exact():
    value = torch.randn(512, 512)
    data = dumps(value)
    assert len(data) >= value.numel() * 4  # incompressible noise: neither coded nor compressed
    assert bit_equal(loads(data), value)


def test_compressible_tensors_are_compressed():
    value = torch.arange(1 << 18, dtype=torch.int64) // 1000  # runs of equal values
    data = dumps(value)
    assert len(data) < value.numel() * 8 // 4
    assert torch.equal(loads(data), value)


def test_bfloat16_is_only_an_explicit_lossy_option():
    value = torch.randn(300, 300, dtype=torch.float32)
    assert bit_equal(loads(dumps(value)), value)
    lossy = dumps(value, bfloat16=True)
    back = loads(lossy)
    assert back.dtype == torch.float32 and len(lossy) < value.numel() * 2 + 4096
    assert torch.allclose(back, value, rtol=1 / 128, atol=0)
    assert not bit_equal(back, value)


def test_expansion_is_bounded_by_the_reader():
    data = dumps(torch.zeros(1 << 20))  # compresses to almost nothing
    assert len(data) < 64 << 10
    with pytest.raises(SerializationError):
        loads(data, max_bytes=1 << 20)
    assert torch.equal(loads(data, max_bytes=8 << 20), torch.zeros(1 << 20))


def test_a_value_is_bound_to_its_key_and_to_the_secret():
    value = {"x": torch.arange(10)}
    data = dumps(value, key="a")
    assert torch.equal(loads(data, key="a")["x"], value["x"])
    with pytest.raises(SerializationError, match="another key"):
        loads(data, key="b")
    secret = mac_key("s3cret")
    keyed = dumps(value, key="a", mac=secret)
    assert torch.equal(loads(keyed, key="a", mac=secret)["x"], value["x"])
    for reader in (None, mac_key("guess")):  # no secret, or the wrong one
        with pytest.raises(SerializationError, match="tag mismatch"):
            loads(keyed, key="a", mac=reader)
    with pytest.raises(SerializationError, match="tag mismatch"):
        loads(data, key="a", mac=secret)  # an unkeyed value where a secret is expected
    forged = bytearray(keyed)
    forged[8:24] = dumps(value, key="b")[8:24]  # the key digest swapped: the tag covers it
    with pytest.raises(SerializationError):
        loads(bytes(forged), key="b", mac=secret)
    assert mac_key("") is None and mac_key(None) is None and len(mac_key(b"k")) == 32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("count", [40000, 40001])
def test_level_codes_read_back_exact_in_every_layout(dtype, count):
    """Odd counts and uncompressed values included."""
    value = levels_tensor(200, shape=(count,), dtype=dtype, seed=count)
    for compress in (True, False):
        assert bit_equal(loads(dumps(value, compress=compress)), value)
    assert len(dumps(value, compress=False)) >= count  # one byte per code, as stored


def test_a_level_code_past_the_table_is_refused():
    value = levels_tensor(10, shape=(40000,))
    data = dumps(value, compress=False)
    header_length = int.from_bytes(data[4:8], "little")
    header, payload = data[PREFIX : PREFIX + header_length], bytearray(data[PREFIX + header_length :])
    import json

    start, length = json.loads(header)["r"]
    payload[start + length - 3] = 200  # a code no level has (the table holds 10)
    with pytest.raises(SerializationError, match="past its table"):
        loads(sealed(header, bytes(payload)))  # before: silently clipped to the last level


LAYOUTS = {  # name: (value, the header's (code type, grouping))
    "qwen2-vl patches": (lambda: qwen_patches(), ("uint8", [392, 3])),
    "nchw": (lambda: normalized_pixels((2, 3, 48, 64), 1), ("uint8", [48 * 64, 3])),
    "frames, channels": (lambda: normalized_pixels((4, 3, 40, 40), 1, dtype=torch.float64), ("uint8", [1600, 3])),
    "float16 nchw": (lambda: normalized_pixels((1, 3, 128, 128), 1, dtype=torch.float16), ("uint8", [128 * 128, 3])),
    "one table, uint8": (lambda: levels_tensor(200, shape=(50001,)), ("uint8", [50001, 1])),
    "one table, uint16": (lambda: levels_tensor(3000, shape=(40000,), seed=3), ("uint16", [40000, 1])),
    # 300 levels in a channel: not per channel; 900 in the tensor: one uint16 table
    "over 256 per channel": (lambda: normalized_pixels((1, 3, 100, 100), 1, levels=300), ("uint16", [30000, 1])),
}


def adversarial(value: torch.Tensor) -> torch.Tensor:
    """The value with every ADVERSARIAL_F32 pattern (or its float64 widening) written into its first
    elements, bit for bit."""
    value = value.clone()
    flat = value.reshape(-1)
    patterns = torch.tensor(ADVERSARIAL_F32, dtype=torch.int64).to(torch.int32).view(torch.float32)
    if value.dtype == torch.float32:
        flat.view(torch.int32)[: len(ADVERSARIAL_F32)] = patterns.view(torch.int32)
    elif value.dtype == torch.float64:
        flat.view(torch.int64)[:2] = torch.tensor([0x7FF8000000000001, -0x8000000000000000])  # a NaN payload, -0.0
    else:
        # a NaN payload, -0.0, a denormal
        flat.view(torch.int16)[:3] = torch.tensor([0x7E01, -0x8000, 0x0001], dtype=torch.int16)
    return value


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "nan-payloads-zeros-denormals"])
def test_every_level_layout_reads_back_bit_for_bit(name, hostile):
    make, (code_type, grouping) = LAYOUTS[name]
    value = make()
    if hostile:
        value = adversarial(value)
    for compress in (True, False):
        data = dumps(value, key="k", compress=compress)
        node = header_of(data)
        assert (node.get("c"), node.get("g")) == (code_type, grouping), name
        back = loads(data, key="k")
        assert bit_equal(back, value), name
        # anywhere in memory: codes at an odd address (a memory map's page) read the same
        shifted = memoryview(bytes(1) + data)[1:]
        assert bit_equal(loads(shifted, key="k"), value)
        for cut in (len(data) - 1, len(data) // 2, 41):
            with pytest.raises(SerializationError):
                loads(data[:cut], key="k")


def test_more_levels_than_one_table_holds_stay_raw_and_exact():
    value = normalized_pixels((1, 3, 100, 100), 1) + torch.arange(30000, dtype=torch.float32).reshape(1, 3, 100, 100)
    data = dumps(value, compress=False)
    assert "k" not in header_of(data)
    assert bit_equal(loads(data), value)


def reseal(data: bytes, edit) -> bytes:
    """The value with its header edited by `edit(tree)` and tagged again (a writer without a
    secret can do this)."""
    import json

    tree = header_of(data)
    edit(tree)
    header = json.dumps(tree).encode()
    return sealed(header, data[PREFIX + int.from_bytes(data[4:8], "little") :])


@pytest.mark.parametrize(
    "grouping",
    [
        [0, 3],
        [392, 0],
        [-1, 3],
        [392, 5],
        ["392", 3],
        [392],
        [392, 3, 1],
        None,
        7,
        [392, 1 << 70],
        [1 << 63, 3],
        [64 * 1176 + 1, 3],
    ],
)
def test_a_bad_grouping_is_refused(grouping):
    data = dumps(qwen_patches(), compress=False)
    assert loads(reseal(data, lambda tree: None)) is not None  # resealing alone keeps it readable

    def edit(tree):
        if grouping is None:
            del tree["g"]
        else:
            tree["g"] = grouping

    with pytest.raises(SerializationError):
        loads(reseal(data, edit))


def test_a_code_past_its_channels_table_is_refused():
    value = normalized_pixels((1, 3, 100, 100), 1, levels=10)  # 10 levels per channel: tables of 10
    data = dumps(value, compress=False)
    node = header_of(data)
    assert node["g"] == [10000, 3]
    header_length = int.from_bytes(data[4:8], "little")
    header, payload = data[PREFIX : PREFIX + header_length], bytearray(data[PREFIX + header_length :])
    start, length = node["r"]
    payload[start + 25000] = 10  # channel 2, one past its table
    with pytest.raises(SerializationError, match="past its table"):
        loads(sealed(header, bytes(payload)))


def test_native_level_coder_checks_its_sizes():
    src = np.arange(1000, dtype=np.uint32) % 7
    codes, tables = np.empty(1000, np.uint8), np.zeros(3 * 8, np.uint32)
    assert _C.level_encode(src, 10, 3, 8, codes, tables) == [7, 7, 7]
    assert _C.level_encode(src, 10, 3, 6, codes.copy(), np.zeros(18, np.uint32)) is None  # a group past its levels
    out = np.empty(1000, np.uint32)
    assert _C.level_decode(codes, 10, 3, tables, out) and (out == src).all()
    assert not _C.level_decode(np.full(1000, 8, np.uint8), 10, 3, tables, out)  # past each table of 8
    # a run past the codes (all in the first group), even one that would overflow a size_t: no hang
    assert _C.level_decode(np.zeros(1000, np.uint8), (1 << 64) - 1, 3, tables, out) and (out == 0).all()
    assert _C.level_encode(src, (1 << 64) - 1, 3, 8, codes, tables) == [7, 0, 0]
    for args in (
        (codes, 10, 3, tables, np.empty(999, np.uint32)),  # dst shorter than the codes
        (codes, 10, 5, tables, out),  # tables not a multiple of the groups
        (codes, 10, 3, tables, np.empty(1000, np.uint16)),  # dst of another type
        (codes, 0, 3, tables, out),
    ):
        with pytest.raises(ValueError):
            if not _C.level_decode(*args):
                raise ValueError("refused")
    with pytest.raises(ValueError):
        _C.level_encode(src, 10, 3, 300, codes, np.zeros(900, np.uint32))  # 300 levels in uint8 codes
    with pytest.raises(ValueError):
        _C.level_encode(src, 10, 3, 8, np.empty(10, np.uint8), tables)
    misaligned = np.frombuffer(bytes(2001), np.uint16, count=1000, offset=1)  # read as uint16: refused
    with pytest.raises(ValueError):
        _C.level_decode(misaligned, 10, 3, tables, out)


def tiled_patches(patches: int = 64, seed=0) -> torch.Tensor:
    """Qwen2-VL's layout for an image: each patch's two temporal frames equal."""
    frame = normalized_pixels((patches, 3, 1, 14 * 14), 1, seed=seed)
    return frame.expand(patches, 3, 2, 14 * 14).reshape(patches, 3 * 2 * 14 * 14).contiguous()


@pytest.mark.parametrize("compress", [True, False])
def test_repeated_halves_are_stored_once_and_read_back_exact(compress):
    value = tiled_patches()
    data = dumps(value, compress=compress)
    node = header_of(data)
    assert node["g"] == [392, 3] and node["e"] == 196
    if "z" not in node:
        assert node["r"][1] == value.numel() // 2  # uint8 codes of the first halves only
    assert bit_equal(loads(data), value)
    changed = value.clone()
    changed[5, 3 * 392 - 1] = changed[5, 0]  # one element of one second half differs (another level)
    data = dumps(changed, compress=compress)
    assert "e" not in header_of(data) and bit_equal(loads(data), changed)


@pytest.mark.parametrize("half", [-1, "196", True, 195, 392, 98.0, 1 << 70, [196]])
def test_a_bad_repeated_half_is_refused(half):
    data = dumps(tiled_patches(), compress=False)
    assert header_of(data)["e"] == 196

    def edit(tree):
        tree["e"] = half

    with pytest.raises(SerializationError):
        loads(reseal(data, edit))
    with pytest.raises(SerializationError):  # read as if every code were stored
        loads(reseal(data, lambda tree: tree.pop("e")))


@pytest.mark.parametrize("vectorise", [True, False])
def test_the_native_read_of_repeated_halves_equals_the_expanded_codes(vectorise):
    rng = np.random.default_rng(3)
    run, groups, half, length = 392, 3, 98, 200  # two blocks of 2 * 98 in each run
    tables = rng.integers(0, 2**32, groups * length, dtype=np.uint32)
    codes = rng.integers(0, length, 64 * run // 2, dtype=np.uint8)
    expanded = np.repeat(codes.reshape(-1, 1, half), 2, axis=1).reshape(-1)
    out, reference = np.empty(expanded.size, np.uint32), np.empty(expanded.size, np.uint32)
    assert _C.level_decode(expanded, run, groups, tables, reference, 1, vectorise)
    assert _C.level_decode(codes, run, groups, tables, out, 1, vectorise, half)
    assert (out == reference).all()
    codes[-1] = length  # past its table, in the last block's first half
    assert not _C.level_decode(codes, run, groups, tables, out, 1, vectorise, half)
    for bad in (dict(half=97), dict(half=1 << 63), dict(half=len(codes) + 1), dict(dst=out[:-1])):
        with pytest.raises(ValueError):
            args = dict(codes=codes, run=run, groups=groups, tables=tables, dst=out, half=half) | bad
            _C.level_decode(
                args["codes"], args["run"], args["groups"], args["tables"], args["dst"], 1, vectorise, args["half"]
            )


def repeated_halves(blocks: int, half: int, groups: int, levels: int, seed: int) -> tuple[np.ndarray, int]:
    """(patterns whose every block of 2 * half repeats its first half, the run: 2 blocks)."""
    rng = np.random.default_rng(seed)
    run = 4 * half
    table = rng.integers(0, 2**32, groups * levels, dtype=np.uint32)
    group = (np.arange(blocks * half) // (run // 2)) % groups
    firsts = table.reshape(groups, levels)[group, rng.integers(0, levels, blocks * half)].reshape(blocks, 1, half)
    return np.repeat(firsts, 2, axis=1).reshape(-1), run


@pytest.mark.parametrize("vectorise", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("half,levels", [(196, 200), (7, 256), (16, 3), (1, 1)])
def test_the_native_write_of_repeated_halves_codes_the_first_halves(vectorise, threads, half, levels):
    """With `half`, the coder gives the full write's tables and the first halves of its codes
    (vectorised and portable, on one or more threads, halves that are and are not whole vectors),
    which the halves read expands back to every pattern."""
    src, run = repeated_halves(2048, half, 3, levels, seed=half)
    full, full_tables = np.empty(src.size, np.uint8), np.zeros(3 * 256, np.uint32)
    firsts, tables = np.empty(src.size // 2, np.uint8), np.zeros(3 * 256, np.uint32)
    counts = _C.level_encode(src, run, 3, 256, full, full_tables, threads, vectorise)
    assert counts is not None
    assert _C.level_encode(src, run, 3, 256, firsts, tables, threads, vectorise, half) == counts
    assert (tables == full_tables).all()
    assert (firsts == full.reshape(-1, 2, half)[:, 0].reshape(-1)).all()
    out = np.empty(src.size, np.uint32)
    assert _C.level_decode(firsts, run, 3, tables, out, 1, vectorise, half) and (out == src).all()


@pytest.mark.parametrize("vectorise", [True, False])
@pytest.mark.parametrize("block,offset", [(0, 0), (0, 195), (1023, 17), (2047, 192), (2047, 195)])
def test_one_element_unlike_its_twin_stops_the_repeated_halves_write(vectorise, block, offset):
    """An element of a second half unlike its twin in the first, anywhere (first and last block, a
    whole vector's lane, the masked tail of a half of 196), makes the halves write say None, and
    the full write still codes the patterns."""
    src, run = repeated_halves(2048, 196, 3, 200, seed=1)
    at = block * 392 + 196 + offset
    src[at] = src[at - 196] ^ 1
    firsts, tables = np.empty(src.size // 2, np.uint8), np.zeros(3 * 256, np.uint32)
    assert _C.level_encode(src, run, 3, 256, firsts, tables, 2, vectorise, 196) is None
    assert _C.level_encode(src, run, 3, 256, np.empty(src.size, np.uint8), tables, 2, vectorise) is not None


def test_the_native_repeated_halves_write_checks_its_sizes():
    src, run = repeated_halves(64, 196, 3, 200, seed=2)
    tables = np.zeros(3 * 256, np.uint32)
    for codes, run_, half in (
        (np.empty(src.size, np.uint8), run, 196),  # codes for every pattern
        (np.empty(src.size // 2, np.uint8), run, 195),  # run not a multiple of 2 * half
        (np.empty(src.size // 2, np.uint8), 2 * run + 392, 392 * 2),  # src not either
        (np.empty(src.size // 2, np.uint8), run, src.size),
    ):  # half past the patterns
        with pytest.raises(ValueError):
            _C.level_encode(src, run_, 3, 256, codes, tables, 1, True, half)


def test_a_recycled_code_buffer_is_reused_and_only_one_that_was_lent():
    """Codes stored as they lie take the thread's buffer; `recycle` of the parts that hold it gives
    it back (the next value codes into the same memory), `recycle` of other parts does not."""
    from lazymedia.cache._serialize import dump_parts, recycle

    def codes_of(parts):
        return max(
            (np.frombuffer(part, np.uint8) for part in parts if isinstance(part, memoryview)),
            key=lambda array: array.nbytes,
        )

    first = dump_parts(tiled_patches(seed=1), compress=False)
    second = dump_parts(tiled_patches(seed=2), compress=False)  # the first's buffer is still lent
    assert not np.may_share_memory(codes_of(first), codes_of(second))
    recycle(dump_parts({"x": torch.arange(10)}))  # parts without codes: nothing to give back
    third = dump_parts(tiled_patches(seed=3), compress=False)
    assert not np.may_share_memory(codes_of(third), codes_of(first))
    assert not np.may_share_memory(codes_of(third), codes_of(second))
    recycle(third)
    fourth = dump_parts(tiled_patches(seed=4), compress=False)
    assert np.may_share_memory(codes_of(fourth), codes_of(third))
    assert bit_equal(loads(b"".join(fourth)), tiled_patches(seed=4))
    assert bit_equal(loads(b"".join(second)), tiled_patches(seed=2))  # never recycled: intact


def test_codes_stored_as_they_lie_are_not_overwritten_by_the_next_value():
    """A thread codes into one reused buffer; codes that a value keeps as they are (no halves, no
    LZ4) leave it to that value, so a second value's coding does not change the first's parts."""
    from lazymedia.cache._serialize import dump_parts

    first, second = qwen_patches(seed=1), qwen_patches(seed=2)
    parts = dump_parts(first, compress=False)
    assert "e" not in header_of(b"".join(parts))
    dump_parts(second, compress=False)
    assert bit_equal(loads(b"".join(parts)), first)


def test_the_zero_copy_layout_reads_as_views_of_a_writable_buffer():
    value = {"pixel_values": qwen_patches(), "grid": torch.tensor([[1, 8, 8]]), "bytes": b"abc"}
    data = dumps(value, key="k", levels=False, compress=False)
    header = header_of(data)["d"]["pixel_values"]
    assert "k" not in header and "z" not in header  # stored as it is
    buffer = bytearray(data)
    read = loads(buffer, key="k", zero_copy=True)
    assert bit_equal(read["pixel_values"], value["pixel_values"]) and read["bytes"] == b"abc"
    start = np.frombuffer(buffer, np.uint8).ctypes.data
    address = read["pixel_values"].data_ptr()
    assert start <= address < start + len(buffer)  # a view of the buffer, not a copy
    assert read["pixel_values"].data_ptr() != loads(bytes(data), key="k", zero_copy=True)["pixel_values"].data_ptr()
    copied = loads(buffer, key="k")  # without zero_copy: tensors own their memory
    assert not start <= copied["pixel_values"].data_ptr() < start + len(buffer)


@pytest.mark.parametrize("layout", [{}, {"levels": False, "compress": False}])
def test_reading_a_value_leaves_no_reference_cycle(layout):
    """A read's tensors are its only hold on the buffer it read: a cycle would keep the buffer
    (HostCache's pooled read buffer) until the garbage collector runs, and every hit would take
    a new one."""
    value = {
        "pixel_values": qwen_patches(),
        "grid": torch.tensor([[1, 8, 8]]),
        "nested": [{"b": b"x"}, (1, 2.5)],
        "pairs": {1: "one"},
    }
    data = bytearray(dumps(value, key="k", **layout))
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            assert bit_equal(loads(data, key="k", zero_copy=True)["pixel_values"], value["pixel_values"])
        with pytest.raises(SerializationError):
            loads(data, key="other")
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_verify_payload_false_reads_the_header_tag_only():
    data = bytearray(dumps({"x": torch.arange(1000)}, key="k", levels=False, compress=False))
    data[-1] ^= 1  # the payload damaged
    with pytest.raises(SerializationError, match="payload tag"):
        loads(bytes(data), key="k")
    assert loads(bytes(data), key="k", verify_payload=False)["x"][-1] != 999  # read as it lies
    data[PREFIX] ^= 1  # the header damaged: refused either way
    with pytest.raises(SerializationError, match="tag mismatch"):
        loads(bytes(data), key="k", verify_payload=False)


@pytest.mark.skipif(not _C.level_gather_vectorised(), reason="no AVX-512 VBMI on this CPU: one path only")
@pytest.mark.parametrize("elements", [np.uint16, np.uint32])
@pytest.mark.parametrize(
    "n,run,groups,length",
    [(1000, 10, 3, 8), (64 * 1176, 392, 3, 200), (12345, 7, 4, 256), (777, 1000, 1, 1), (64 * 5 + 17, 33, 2, 130)],
)
def test_the_vectorised_level_read_equals_the_portable_loop(elements, n, run, groups, length):
    """The AVX-512 VBMI read against the portable loop: tails, runs across groups and a code past
    its table included."""
    rng = np.random.default_rng(n)
    tables = rng.integers(0, np.iinfo(elements).max, groups * length, dtype=elements, endpoint=True)
    codes = rng.integers(0, length, n, dtype=np.uint8)
    fast, portable = np.empty(n, elements), np.empty(n, elements)
    assert _C.level_decode(codes, run, groups, tables, fast, 1, True)
    assert _C.level_decode(codes, run, groups, tables, portable, 1, False)
    assert (fast == portable).all() and (
        fast == tables.reshape(groups, length)[(np.arange(n) // run) % groups, codes]
    ).all()
    if length < 256:
        codes[n - 1] = length  # the last element, in a masked tail
        assert not _C.level_decode(codes, run, groups, tables, fast, 1, True)
        assert not _C.level_decode(codes, run, groups, tables, portable, 1, False)


@pytest.mark.skipif(not _C.level_gather_vectorised(), reason="no AVX-512 VBMI on this CPU: one path only")
@pytest.mark.parametrize(
    "n,run,groups,levels",
    [(1000, 10, 3, 8), (300_000, 392, 3, 200), (70_000, 7, 4, 256), (5000, 1000, 1, 1), (64 * 5 + 17, 33, 2, 130)],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_vectorised_level_write_equals_the_portable_loop(n, run, groups, levels, threads):
    """The AVX-512 write gives the portable loop's codes and tables: the same numbering by first
    appearance, zero patterns (an empty slot's key), several rows renumbered, and a group one
    level past its table included."""
    rng = np.random.default_rng(n)
    table = rng.integers(0, 2**32, groups * levels, dtype=np.uint32)
    src = table.reshape(groups, levels)[(np.arange(n) // run) % groups, rng.integers(0, levels, n)]
    src[::97] = table[0]
    src[5] = 0
    results = []
    for vectorise in (True, False):
        codes, tables = np.empty(n, np.uint8), np.zeros(groups * 256, np.uint32)
        results.append((_C.level_encode(src, run, groups, 256, codes, tables, threads, vectorise), codes, tables))
    (fast_counts, fast, fast_tables), (counts, portable, portable_tables) = results
    assert fast_counts == counts
    if counts is None:  # the zero made one group's 257th level
        return
    assert (fast == portable).all() and (fast_tables == portable_tables).all()
    assert (fast_tables.reshape(groups, 256)[(np.arange(n) // run) % groups, fast] == src).all()


@pytest.mark.skipif(not _C.level_gather_vectorised(), reason="no AVX-512 VBMI on this CPU: one path only")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_vectorised_level_write_follows_probe_chains(threads):
    """Patterns that all hash to one slot (inverse multiples of the hash's factor): every lookup
    walks a chain of up to 64 slots, in the 64-bit pair gathers, and still gives the portable
    loop's codes."""
    inverse = pow(0x9E3779B1, -1, 1 << 32)
    table = np.array([(inverse * (0x4000_0000 + j)) % (1 << 32) for j in range(64)], np.uint32)
    rng = np.random.default_rng(7)
    n = 200_003
    src = table[rng.integers(0, 64, n)]
    results = []
    for vectorise in (True, False):
        codes, tables = np.empty(n, np.uint8), np.zeros(256, np.uint32)
        results.append((_C.level_encode(src, n, 1, 256, codes, tables, threads, vectorise), codes, tables))
    (fast_counts, fast, fast_tables), (counts, portable, portable_tables) = results
    assert fast_counts == counts == [64]
    assert (fast == portable).all() and (fast_tables == portable_tables).all()
    assert (fast_tables[fast] == src).all()


def test_an_empty_level_coded_tensor_is_refused_not_a_crash():
    """A sealed header claiming a level-coded tensor of no elements (anyone without the secret can
    write one) is a bad value; the native coder takes empty inputs (it divided by zero before)."""
    header = b'{"t":"float32","s":[0],"k":[0,4],"c":"uint8","g":[1,1],"r":[0,0]}'
    with pytest.raises(SerializationError, match="level coding"):
        loads(sealed(header, bytes(64)))
    empty, tables = np.empty(0, np.uint32), np.zeros(256, np.uint32)
    assert _C.level_encode(empty, 1, 1, 256, np.empty(0, np.uint8), tables) == [0]
    assert _C.level_decode(np.empty(0, np.uint8), 1, 1, tables, empty)
