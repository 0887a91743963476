"""Cache values as bytes without pickle: every supported type round-trips, and any damage reads
as a SerializationError (a miss), never as an untyped error or code that runs."""
import pickle
import random

import blake3
import numpy as np
import pytest
import torch

from lazymedia.cache.serialize import MAGIC, SerializationError, dumps, key_digest, loads, mac_key


def sample_value():
    return {"pixel_values": torch.randn(6, 5), "half": torch.ones(3, dtype=torch.bfloat16),
            "grid": torch.tensor([[1, 4, 4]]), "mask": np.array([True, False]), "array": np.arange(12.0).reshape(3, 4),
            "empty": torch.empty(0, 7), "scalar": torch.tensor(3.5), "plain": [1, 2.5, None, "x", True],
            "tuple": (b"raw", {"nested": [np.int64(7).item()]}), 7: "integer key"}


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


@pytest.mark.parametrize("value", [object(), {1.5j}, [lambda: 0], torch.zeros(2, dtype=torch.complex64),
                                   np.array(["text"])])
def test_unsupported_types_are_refused_on_write(value):
    with pytest.raises(SerializationError):
        dumps(value)


def test_pickles_and_foreign_bytes_are_refused():
    for data in (pickle.dumps({"x": 1}), b"", b"LMV2", b"LMV2\xff\xff\xff\xff{}", b'LMV2\x02\x00\x00\x00[]',
                 b"LMV1" + dumps({"x": 1})[4:]):
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


def sealed(header: bytes, payload: bytes, key: str = "") -> bytes:
    """A well-tagged LMV3 value around any header and payload (what a writer without a secret
    can produce)."""
    bound = key_digest(key)
    tag = blake3.blake3(bound + header + payload).digest(16)
    return MAGIC + len(header).to_bytes(4, "little") + bound + tag + header + payload


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(
        b.contiguous().view(torch.uint8).numpy())


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
    assert len(data) <= 6 << 20, len(data)
    back = loads(data)
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


def test_levels_the_sample_missed_are_added():
    value = levels_tensor(300, shape=(1 << 18,))
    value[12345] = 123.456  # one rare level at a position the strided sample skips
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
    """uint8 codes are looked up two at a time (odd counts included); uncompressed values too."""
    value = levels_tensor(200, shape=(count,), dtype=dtype, seed=count)
    for compress in (True, False):
        assert bit_equal(loads(dumps(value, compress=compress)), value)
    assert len(dumps(value, compress=False)) >= count  # one byte per code, as stored


def test_a_level_code_past_the_table_is_refused():
    value = levels_tensor(10, shape=(40000,))
    data = dumps(value, compress=False)
    header_length = int.from_bytes(data[4:8], "little")
    header, payload = data[40:40 + header_length], bytearray(data[40 + header_length:])
    import json

    start, length = json.loads(header)["r"]
    payload[start + length - 3] = 200  # a code no level has (the table holds 10)
    with pytest.raises(SerializationError, match="past its table"):
        loads(sealed(header, bytes(payload)))  # before: silently clipped to the last level
