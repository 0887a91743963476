"""Cache values as bytes without pickle: every supported type round-trips, and any damage reads
as a SerializationError (a miss), never as an untyped error or code that runs."""
import pickle
import random

import numpy as np
import pytest
import torch

from lazymedia.cache.serialize import SerializationError, dumps, loads


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
    for data in (pickle.dumps({"x": 1}), b"", b"LMV1", b"LMV1\xff\xff\xff\xff{}", b'LMV1\x02\x00\x00\x00[]'):
        with pytest.raises(SerializationError):
            loads(data)


def test_random_damage_is_a_serialization_error_or_a_value():
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
        try:
            loads(bytes(damaged))
        except SerializationError:
            pass


def test_deep_nesting_is_bounded():
    value = []
    for _ in range(40):
        value = [value]
    with pytest.raises(SerializationError):
        dumps(value)
    header = b"[" * 100000 + b"]" * 100000
    with pytest.raises(SerializationError):
        loads(b"LMV1" + len(header).to_bytes(4, "little") + header)
