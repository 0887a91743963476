"""The public surface: the names `lazymedia` exports, the keyword-only signatures of the entry
points, and the types a checker sees. mypy checks this file (pyproject.toml [tool.mypy] files, run
by .ci/run), so every `assert_type` below is a claim about the public types that CI holds; pytest
runs it too, so the values behind them exist."""

import asyncio
import base64
import dataclasses
import inspect
from pathlib import Path
from typing import Any, assert_type

import torch

import lazymedia
from lazymedia import synthetic
from lazymedia.cache import (
    Cache,
    ChainableTier,
    HostCache,
    ProcessorCache,
    RedisCache,
    SharedChain,
    SharedTier,
    TieredCache,
)

PUBLIC_NAMES = [
    "AudioSamples",
    "AudioSpec",
    "CacheStats",
    "DEFAULT_LIMITS",
    "DecodeEngine",
    "ImageSpec",
    "InvalidMediaError",
    "LazyMedia",
    "Limits",
    "LruCache",
    "MediaCapacityError",
    "MediaConnector",
    "MediaError",
    "MediaFetchError",
    "MediaNotCachedError",
    "MediaReleasedError",
    "MediaTooLargeError",
    "Processor",
    "ProcessorCache",
    "UnprocessableMediaError",
    "VideoFrames",
    "VideoSpec",
    "from_base64",
    "load",
    "load_audio",
    "load_image",
    "load_video",
    "register_sampler",
]

# Entry point -> (positional parameters, keyword-only parameters in order). A change here is an
# API change: say it in the README and docs/usage.md.
SIGNATURES = {
    "load": (["modality", "data"], ["limits", "key", "item_id"]),
    "load_image": (
        ["data"],
        ["mode", "background", "apply_orientation", "size", "resample", "draft", "limits", "key", "item_id"],
    ),
    "load_video": (
        ["data"],
        ["num_frames", "fps", "max_frames", "max_duration", "sampler", "size", "decoder", "limits", "key", "item_id"],
    ),
    "load_audio": (["data"], ["sample_rate", "mono", "limits", "key", "item_id"]),
    "Processor": (
        ["process_fn"],
        ["cache", "engine", "namespace", "process_workers", "device", "keep_on_device", "bytes_per_decoded_byte"],
    ),
}

LOADER_SPECS = {"load_image": lazymedia.ImageSpec, "load_video": lazymedia.VideoSpec, "load_audio": lazymedia.AudioSpec}


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(lazymedia.__all__) == sorted(PUBLIC_NAMES)
    for name in lazymedia.__all__:
        assert getattr(lazymedia, name) is not None, name


def test_engine_diagnostics_live_in_the_engine_package() -> None:
    """backends, BackendStatus and default_engine are diagnostics, not the user API: their home is
    lazymedia.engine; the top-level names still resolve (the same objects) for earlier code."""
    from lazymedia import engine

    for name in ("BackendStatus", "backends", "default_engine"):
        assert name in engine.__all__ and name not in lazymedia.__all__
        assert getattr(lazymedia, name) is getattr(engine, name)
    assert all(isinstance(status, engine.BackendStatus) for status in engine.backends())


def test_entry_points_take_their_settings_by_keyword_only() -> None:
    for name, (positional, keyword_only) in SIGNATURES.items():
        parameters = inspect.signature(getattr(lazymedia, name)).parameters.values()
        assert [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD] == positional, name
        assert [p.name for p in parameters if p.kind is p.KEYWORD_ONLY] == keyword_only, name


def test_loader_defaults_are_the_spec_defaults() -> None:
    """load_video's num_frames=32 and VideoSpec's must not drift apart (a handle loaded with the
    defaults and a connector's fetch with no settings must share a key)."""
    for name, spec_cls in LOADER_SPECS.items():
        parameters = inspect.signature(getattr(lazymedia, name)).parameters
        for field in dataclasses.fields(spec_cls):
            assert parameters[field.name].default == field.default, (name, field.name)


def test_decoded_values_are_typed_for_checkers() -> None:
    image = lazymedia.load_image(synthetic.jpeg(48, 64))
    assert_type(image, lazymedia.LazyMedia[torch.Tensor])
    pixels = image.decode()
    assert_type(pixels, torch.Tensor)
    assert tuple(pixels.shape) == (48, 64, 3)

    video = lazymedia.load_video(synthetic.video(frames=12), num_frames=4)
    frames = video.media
    assert_type(frames, lazymedia.VideoFrames)
    assert_type(frames.frames, torch.Tensor)
    assert frames.frames.shape[0] == 4

    audio = lazymedia.load_audio(synthetic.tone(seconds=0.25, rate=8000))
    decoded = audio.media
    assert_type(decoded, lazymedia.AudioSamples)
    assert_type(decoded.data, torch.Tensor)
    assert decoded.data is decoded.samples and tuple(decoded.data.shape) == (1, 2000)  # mono by default

    mean = image.map(lambda tensor: float(tensor.float().mean()), key="mean-v1")
    assert_type(mean, lazymedia.LazyMedia[float])
    assert isinstance(mean.decode(), float)

    generic = lazymedia.load("image", synthetic.jpeg(8, 8))
    assert_type(generic, lazymedia.LazyMedia[Any])


def test_lazily_imported_names_are_classes_for_checkers() -> None:
    connector: lazymedia.MediaConnector = lazymedia.MediaConnector()
    try:
        url = "data:image/jpeg;base64," + base64.b64encode(synthetic.jpeg(8, 8)).decode()
        handle = connector.fetch_sync("image", url)
        assert handle.decode().shape == (8, 8, 3)
    finally:
        connector.close()
    processor = lazymedia.Processor(
        lambda decoded: [tuple(m.shape) for m in decoded], cache=ProcessorCache(capacity_bytes=1 << 20)
    )
    outputs = processor.apply([lazymedia.load_image(synthetic.jpeg(8, 8))])
    assert_type(outputs, list[tuple[Any, ...]])  # Processor[Output]: apply returns what process_fn does
    assert outputs == [(8, 8, 3)]
    assert isinstance(TieredCache, type) and isinstance(lazymedia.VideoFrames, type)


def test_every_cache_a_processor_takes_is_its_cache_protocol(tmp_path: Path) -> None:
    """mypy checks that ProcessorCache, TieredCache and the shared tiers (HostCache, RedisCache,
    their SharedChain) satisfy the protocols Processor's `cache` parameter names; pytest that a
    Processor works over each (the Redis tier here is unreachable, so it degrades to misses)."""
    host = HostCache(str(tmp_path / "host"), capacity_bytes=16 << 20)
    fleet = RedisCache("redis://127.0.0.1:1/0", timeout_s=0.05)
    tiers: list[ChainableTier] = [host, fleet]
    chain: SharedTier = SharedChain(tiers)
    caches: list[Cache] = [
        ProcessorCache(capacity_bytes=1 << 20),
        TieredCache(ProcessorCache(), host),
        TieredCache(ProcessorCache(), *tiers),
    ]
    for number, cache in enumerate(caches):
        item = lazymedia.load_image(synthetic.jpeg(8, 8 + number))
        processor = lazymedia.Processor(lambda decoded: [tuple(m.shape) for m in decoded], cache=cache)
        assert processor.apply([item]) == [(8, 8 + number, 3)]
        assert cache.lookup(processor.cache_key(item)) == (True, (8, 8 + number, 3))
    token = chain.try_lease("leased")
    assert token is not None and host.try_lease("leased") is None  # held on the host tier
    asyncio.run(chain.arelease("leased", token))  # every tier's release has an asyncio form
    assert host.try_lease("leased") is not None
    fleet.close()
