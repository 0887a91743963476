"""A request cannot change what a later hit returns: hits share the stored object (no copy), and
a value a reader changed in place is dropped and recomputed, never served (lazymedia.lru)."""

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import synthetic
from lazymedia.lru import LruCache


def features(decoded):
    return [{"pixel_values": media.float() / 255, "grid": [1, 2, 3]} for media in decoded]


@pytest.fixture
def processor():
    engine = lazymedia.DecodeEngine(max_workers=1, isolate=())
    yield lazymedia.Processor(features, engine=engine)
    engine.shutdown()


def test_an_unchanged_hit_is_the_stored_object_itself(processor):
    data = synthetic.jpeg()
    first = processor.apply([lazymedia.load_image(data)])[0]
    again = lazymedia.load_image(data)
    assert processor.apply([again])[0] is first and not again.is_decoded


@pytest.mark.parametrize(
    "damage",
    [
        lambda out: out["pixel_values"].mul_(0),  # the in-place op
        lambda out: out["pixel_values"][0, 0].fill_(7),  # through a view
        lambda out: out.__setitem__("pixel_values", torch.zeros(1)),
        lambda out: out["grid"].append(4),
        lambda out: out.pop("grid"),
    ],
)
def test_a_value_changed_by_a_reader_is_recomputed_not_served(processor, damage):
    data = synthetic.jpeg()
    first = processor.apply([lazymedia.load_image(data)])[0]
    expected = first["pixel_values"].clone()
    damage(first)
    again = lazymedia.load_image(data)
    second = processor.apply([again])[0]
    assert second is not first and again.is_decoded  # a miss: decoded again
    assert torch.equal(second["pixel_values"], expected) and second["grid"] == [1, 2, 3]
    stats = processor.cache.stats()
    assert stats.mutated == 1 and stats.hits == 0 and stats.entries == 1
    third = lazymedia.load_image(data)
    assert processor.apply([third])[0] is second and not third.is_decoded  # the new value is a plain hit


def test_numpy_arrays_are_stored_read_only():
    cache = LruCache(10)
    value = {"array": np.zeros(4)}
    cache.put("k", value)
    with pytest.raises(ValueError, match="read-only"):
        value["array"][0] = 1
    assert cache.get("k") is value


def test_a_value_holding_itself_is_sealed():
    cache = LruCache(10)
    value: list = [torch.ones(2)]
    value.append(value)
    cache.put("k", value)
    assert cache.get("k") is value
    value[0].add_(1)
    assert cache.get("k") is None and cache.stats().mutated == 1
