"""Two-phase apply: hits never decode, misses decode concurrently, single-flight, typed errors."""

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, ProcessorCache, UnprocessableMediaError
from lazymedia.codecs import _image as image_codec

from conftest import encode, make_image


@pytest.fixture(scope="module")
def images():
    return [encode(make_image(64, 80, seed=s), "JPEG", quality=90) for s in range(6)]


@pytest.fixture
def engine():
    with DecodeEngine(max_workers=4) as e:
        yield e


class Spy:
    """Counts decoder calls; optionally blocks each decode on a barrier or sleeps."""

    def __init__(self, monkeypatch, delay=0.0, barrier=None):
        self.calls = 0
        self.lock = threading.Lock()
        decode = image_codec.decode

        def counting(*args, **kwargs):
            with self.lock:
                self.calls += 1
            if barrier is not None:
                barrier.wait(timeout=10)
            if delay:
                time.sleep(delay)
            return decode(*args, **kwargs)

        monkeypatch.setattr(image_codec, "decode", counting)


def mean_pixel(items):
    return [float(t.float().mean()) for t in items]


def test_hits_never_decode(monkeypatch, images, engine):
    spy = Spy(monkeypatch)
    processor = Processor(mean_pixel, engine=engine)
    first = processor.apply([lazymedia.load_image(b) for b in images])
    assert spy.calls == len(images)
    again = [lazymedia.load_image(b) for b in images]
    assert processor.apply(again) == first
    assert spy.calls == len(images)
    assert all(not item.is_decoded and item.has_bytes for item in again)  # kept for another processor
    stats = processor.cache.stats()
    assert (stats.hits, stats.misses) == (len(images), len(images))


def test_order_duplicates_and_mixed_hits(monkeypatch, images, engine):
    spy = Spy(monkeypatch)
    batches = []
    processor = Processor(lambda items: (batches.append(len(items)), mean_pixel(items))[1], engine=engine)
    processor.apply([lazymedia.load_image(images[0])])
    request = [images[1], images[0], images[1], images[2], images[0]]
    out = processor.apply([lazymedia.load_image(b) for b in request])
    assert spy.calls == 3 and batches == [1, 2]  # images[1] and images[2] once each, in one batch
    assert out == mean_pixel([lazymedia.load_image(b).media for b in request])


def test_misses_release_bytes_after_processing(images, engine):
    items = [lazymedia.load_image(b) for b in images[:2]]
    Processor(mean_pixel, engine=engine).apply(items)
    assert all(item.is_decoded and not item.has_bytes for item in items)


def test_hit_keeps_bytes_shared_with_a_miss(images, engine):
    processor = Processor(mean_pixel, engine=engine)
    processor.apply([lazymedia.load_image(images[0])])
    base = lazymedia.load_image(images[0])
    flipped = base.map(torch.fliplr)
    out = processor.apply([base, flipped])
    assert out[0] == out[1]  # the mean is flip-invariant; the point is that the miss could decode


def test_corrupt_item_index_and_nothing_leaked(monkeypatch, images, engine):
    spy = Spy(monkeypatch, delay=0.05)
    processor = Processor(mean_pixel, engine=engine)
    corrupt = images[2][: len(images[2]) // 2]
    items = [lazymedia.load_image(images[0]), lazymedia.load_image(images[1]), lazymedia.load_image(corrupt)]
    with pytest.raises(UnprocessableMediaError) as info:
        processor.apply(items)
    assert info.value.index == 2 and info.value.status_code == 422 and info.value.modality == "image"
    assert engine.in_flight == 0
    assert processor.in_flight == 0
    assert not items[0].has_bytes and not items[1].has_bytes  # decoded: the decode stands in for them
    assert spy.calls == 3


def test_corrupt_index_is_request_index_not_miss_index(images, engine):
    processor = Processor(mean_pixel, engine=engine)
    processor.apply([lazymedia.load_image(images[0]), lazymedia.load_image(images[1])])
    corrupt = images[3][:200]
    request = [lazymedia.load_image(images[0]), lazymedia.load_image(images[1]), lazymedia.load_image(corrupt)]
    with pytest.raises(UnprocessableMediaError) as info:
        processor.apply(request)
    assert info.value.index == 2


def test_single_flight_16_threads(monkeypatch, images, engine):
    spy = Spy(monkeypatch, delay=0.2)
    process_calls = []
    processor = Processor(lambda items: (process_calls.append(1), mean_pixel(items))[1], engine=engine)
    barrier = threading.Barrier(16)
    results = []

    def request():
        item = lazymedia.load_image(images[4])
        barrier.wait()
        results.append(processor.apply([item])[0])

    threads = [threading.Thread(target=request) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert spy.calls == 1 and len(process_calls) == 1
    assert len(results) == 16 and len(set(results)) == 1


async def test_single_flight_16_async_requests(monkeypatch, images, engine):
    spy = Spy(monkeypatch, delay=0.2)
    processor = Processor(mean_pixel, engine=engine)
    results = await asyncio.gather(*[processor.apply_async([lazymedia.load_image(images[5])]) for _ in range(16)])
    assert spy.calls == 1
    assert len({r[0] for r in results}) == 1


async def test_decodes_of_different_requests_overlap(monkeypatch, images, engine):
    # Each decode waits until two decodes run at once: this passes only if the requests overlap.
    Spy(monkeypatch, barrier=threading.Barrier(2))
    processor = Processor(mean_pixel, engine=engine)
    a, b = await asyncio.gather(
        processor.apply_async([lazymedia.load_image(images[0])]),
        processor.apply_async([lazymedia.load_image(images[1])]),
    )
    assert a != b


class Gate:
    """Patches the image decoder to signal `entered` and then wait for `proceed` (a generous cap),
    so tests order events by what happened, not by sleeping."""

    def __init__(self, monkeypatch):
        self.entered, self.proceed = threading.Event(), threading.Event()
        self.calls = 0
        lock = threading.Lock()
        decode = image_codec.decode

        def gated(*args, **kwargs):
            with lock:
                self.calls += 1
            self.entered.set()
            assert self.proceed.wait(60), "the test never opened the gate"
            return decode(*args, **kwargs)

        monkeypatch.setattr(image_codec, "decode", gated)

    async def wait_entered(self):
        assert await asyncio.to_thread(self.entered.wait, 60)


async def settle():
    """Lets every task that is ready run up to its next real wait."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_event_loop_stays_responsive_during_decode(monkeypatch, images, engine):
    """The decode holds until the loop has ticked 10 times: counted, not timed."""
    gate = Gate(monkeypatch)
    processor = Processor(mean_pixel, engine=engine)

    async def ticker():
        await gate.wait_entered()
        for _ in range(10):
            await asyncio.sleep(0.001)
        gate.proceed.set()

    task = asyncio.create_task(ticker())
    await processor.apply_async([lazymedia.load_image(images[0])])
    await task
    assert gate.calls == 1


async def test_cancellation_drains_and_followers_retry(monkeypatch, images, engine, caplog):
    """A leader cancelled mid-decode: its running decodes finish before the cancel returns, its
    key is abandoned, the follower decodes it again, and nothing is logged (no InvalidStateError
    from a callback on a cancelled future)."""
    import gc
    import logging

    gate = Gate(monkeypatch)
    processor = Processor(mean_pixel, engine=engine)
    leader_items = [lazymedia.load_image(images[0]), lazymedia.load_image(images[1])]
    with caplog.at_level(logging.DEBUG):
        leader = asyncio.create_task(processor.apply_async(leader_items))
        await gate.wait_entered()
        follower = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[0])]))
        await settle()
        leader.cancel()
        await settle()
        gate.proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await leader
        assert engine.in_flight == 0  # the running decodes finished before the cancel returned
        result = await follower
        gc.collect()
        await settle()
    assert gate.calls == 3  # the follower decoded again after the leader abandoned the key
    assert result == mean_pixel([lazymedia.load_image(images[0]).media])
    assert processor.in_flight == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or "InvalidStateError" in r.getMessage()]


async def test_a_leader_cancelled_during_process_fn_never_makes_a_follower_run_it_again(images, engine):
    """architecture-review.md §5 item 9: the leader is cancelled while process_fn runs, with a
    follower waiting; phase 2 finishes on its thread and the follower gets its result."""
    entered, proceed = threading.Event(), threading.Event()
    calls = []

    def slow(decoded):
        calls.append(len(decoded))
        entered.set()
        assert proceed.wait(60)
        return [tuple(t.shape) for t in decoded]

    processor = Processor(slow, engine=engine)
    leader = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[0])]))
    assert await asyncio.to_thread(entered.wait, 60)
    follower = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[0])]))
    await settle()
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader  # returns at once: the request is gone, its phase 2 is not
    await settle()  # a follower told to retry would lead the key again now, before phase 2 ends
    proceed.set()
    assert await follower == [(64, 80, 3)]
    assert calls == [1] and processor.in_flight == 0
    assert processor.apply([lazymedia.load_image(images[0])]) == [(64, 80, 3)] and calls == [1]  # cached


async def test_a_leaders_5xx_is_abandoned_and_its_followers_retry(monkeypatch, images, engine):
    """MediaCapacityError (503) says "not now", not "bad item": the follower decodes itself."""
    entered, proceed = threading.Event(), threading.Event()
    decode = image_codec.decode
    calls = []

    def no_memory_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            assert proceed.wait(60)
            raise lazymedia.MediaCapacityError("no memory for this item right now")
        return decode(*args, **kwargs)

    monkeypatch.setattr(image_codec, "decode", no_memory_once)
    processor = Processor(lambda items: [tuple(t.shape) for t in items], engine=engine)
    leader = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[0])]))
    assert await asyncio.to_thread(entered.wait, 60)
    follower = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[0])]))
    await settle()
    proceed.set()
    with pytest.raises(lazymedia.MediaCapacityError) as info:
        await leader
    assert info.value.status_code == 503
    assert await follower == [(64, 80, 3)] and len(calls) == 2


def test_a_hit_keeps_the_bytes_for_another_processor_that_misses(images, engine):
    """Processors with different caches or namespaces meet the same handle: a hit in one must not
    leave the other unable to decode it (no MediaReleasedError)."""
    first = Processor(mean_pixel, engine=engine)
    second = Processor(lambda items: [tuple(t.shape) for t in items], engine=engine, namespace="shapes")
    first.apply([lazymedia.load_image(images[0])])
    item = lazymedia.load_image(images[0])
    assert first.apply([item]) == mean_pixel([lazymedia.load_image(images[0]).media])  # a hit
    assert item.has_bytes and not item.is_decoded
    assert second.apply([item]) == [(64, 80, 3)]  # a miss there: it decodes
    assert item.is_decoded and not item.has_bytes  # the decode now stands in for the bytes
    assert first.apply([item]) and second.apply([item]) == [(64, 80, 3)]  # hits on a decoded handle


def test_corrupt_error_reaches_followers_with_their_index(monkeypatch, images, engine):
    Spy(monkeypatch, delay=0.2)
    processor = Processor(mean_pixel, engine=engine)
    corrupt = images[0][: len(images[0]) // 2]
    errors = []

    def request(position):
        items = [lazymedia.load_image(images[1]) for _ in range(position)] + [lazymedia.load_image(corrupt)]
        try:
            processor.apply(items)
        except UnprocessableMediaError as exc:
            errors.append(exc.index)

    threads = [threading.Thread(target=request, args=(p,)) for p in (0, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(errors) == [0, 3]


def test_process_fn_errors_leave_no_stuck_keys(images, engine):
    processor = Processor(lambda items: [], engine=engine)
    with pytest.raises(ValueError, match="outputs"):
        processor.apply([lazymedia.load_image(images[0])])
    assert processor.in_flight == 0 and engine.in_flight == 0
    processor.process_fn = mean_pixel
    assert processor.apply([lazymedia.load_image(images[0])])


def test_namespace_separates_processors_sharing_a_cache(images, engine):
    cache = ProcessorCache()
    small = Processor(lambda items: ["small"] * len(items), cache=cache, engine=engine, namespace="size=224")
    large = Processor(lambda items: ["large"] * len(items), cache=cache, engine=engine, namespace="size=448")
    assert small.apply([lazymedia.load_image(images[0])]) == ["small"]
    assert large.apply([lazymedia.load_image(images[0])]) == ["large"]
    assert small.apply([lazymedia.load_image(images[0])]) == ["small"]


def test_mixed_modalities_in_one_request(engine, tmp_path):
    import numpy as np
    import soundfile

    path = tmp_path / "tone.wav"
    soundfile.write(path, np.sin(np.linspace(0, 100, 8000)).astype(np.float32), 8000)
    audio = lazymedia.load_audio(path)
    image = lazymedia.load_image(encode(make_image(8, 8), "PNG"))
    out = Processor(lambda items: [type(i).__name__ for i in items], engine=engine).apply([image, audio])
    assert out == ["Tensor", "AudioSamples"]


async def test_corrupt_items_under_load_log_nothing(images, engine, caplog):
    """1,000 concurrent requests, a fifth with a corrupt item: every error reaches its request,
    and no asyncio future is left with an unread exception ("never retrieved" log lines)."""
    import gc
    import logging

    processor = Processor(mean_pixel, engine=engine)
    corrupt = images[0][:400]

    async def request(k):
        data = [images[k % len(images)], corrupt] if k % 5 == 0 else [images[k % len(images)]]
        distinct = [lazymedia.load_image(b, size=(8 + k % 50, 8)) for b in data]  # most miss
        try:
            await processor.apply_async(distinct)
            return "ok"
        except UnprocessableMediaError as exc:
            assert exc.index == 1
            return "422"

    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        outcomes = await asyncio.gather(*(request(k) for k in range(1000)))
        gc.collect()
        await asyncio.sleep(0)
    assert outcomes.count("422") == 200 and outcomes.count("ok") == 800
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert processor.in_flight == 0


def test_decoded_inputs_pass_through_untouched_and_hit_by_content(engine):
    from PIL import Image

    seen = []
    processor = Processor(lambda items: seen.extend(items) or [type(i).__name__ for i in items], engine=engine)
    pil = Image.fromarray(make_image(16, 16))
    array = make_image(8, 8, seed=3)
    embeds = torch.randn(4, 32, dtype=torch.bfloat16)
    assert processor.apply([pil, array, embeds]) == ["Image", "ndarray", "Tensor"]
    assert seen[0] is pil and seen[1] is array and seen[2] is embeds
    assert processor.apply([Image.fromarray(make_image(16, 16)), array.copy(), embeds.clone()]) == [
        "Image",
        "ndarray",
        "Tensor",
    ]
    assert len(seen) == 3  # equal content: hits, process_fn not called again
    assert engine.in_flight == 0


def test_an_id_hits_what_was_processed_under_it_and_a_miss_is_400_with_its_index(engine, images):
    processor = Processor(lambda items: [tuple(t.shape) for t in items], engine=engine)
    by_id = lazymedia.LazyMedia.from_id("image", "upload-7")
    with pytest.raises(lazymedia.MediaNotCachedError) as info:
        processor.apply([lazymedia.load_image(images[0]), by_id])
    assert info.value.index == 1 and info.value.status_code == 400
    # The first request sends the media with its id; later ones the id alone.
    assert processor.apply([lazymedia.load_image(images[1], item_id="upload-7")]) == [(64, 80, 3)]
    assert processor.apply([by_id, lazymedia.LazyMedia.from_id("image", "upload-7")]) == [(64, 80, 3)] * 2
    other_spec = lazymedia.LazyMedia.from_id("image", "upload-7", size=(8, 8))
    with pytest.raises(lazymedia.MediaNotCachedError):
        processor.apply([other_spec])


async def test_async_apply_takes_decoded_inputs(engine):
    processor = Processor(lambda items: [float(np.asarray(i).mean()) for i in items], engine=engine)
    array = np.full((4, 4), 7, np.uint8)
    assert await processor.apply_async([array]) == [7.0]


def test_an_id_miss_never_fails_an_item_that_brought_its_media(engine, images):
    processor = Processor(lambda items: [tuple(t.shape) for t in items], engine=engine)
    # One request: the id-only handle comes first, the one with bytes decodes for both.
    both = [lazymedia.LazyMedia.from_id("image", "X"), lazymedia.load_image(images[2], item_id="X")]
    assert processor.apply(both) == [(64, 80, 3)] * 2


async def test_a_follower_with_media_is_not_failed_by_an_id_only_leader(monkeypatch, engine, images):
    gate = Gate(monkeypatch)  # request A's other item keeps A's id-only key in flight
    processor = Processor(lambda items: [tuple(t.shape) for t in items], engine=engine)

    async def request(items):
        try:
            return await processor.apply_async(items)
        except lazymedia.MediaError as exc:
            return type(exc).__name__

    a = asyncio.create_task(request([lazymedia.LazyMedia.from_id("image", "Y"), lazymedia.load_image(images[4])]))
    await gate.wait_entered()  # A leads "Y" and waits for its other item's decode
    b = asyncio.create_task(request([lazymedia.load_image(images[3], item_id="Y")]))
    await settle()  # B follows A on "Y"
    gate.proceed.set()
    assert {"A": await a, "B": await b} == {"A": "MediaNotCachedError", "B": [(64, 80, 3)]}
    assert gate.calls == 2  # A's image, then B's own decode of "Y" after A abandoned it


def test_apply_refuses_what_is_neither_a_handle_nor_decoded_media(engine):
    processor = Processor(lambda items: items, engine=engine)
    for value in (b"\xff\xd8 encoded bytes", "https://example.com/a.jpg", 3):
        with pytest.raises(TypeError, match="no stable key"):
            processor.apply([value])


async def test_large_decoded_inputs_are_keyed_off_the_event_loop(monkeypatch, engine):
    from lazymedia import hashing, media

    threads = []

    def recording(modality, value):
        threads.append(threading.current_thread())
        return hashing.object_key(modality, value)

    monkeypatch.setattr(media, "object_key", recording)
    processor = Processor(lambda items: [i.shape for i in items], engine=engine)
    await processor.apply_async([np.zeros((16, 16, 3), np.uint8)])
    await processor.apply_async([np.zeros(hashing.loop_hash_bytes() + 1, np.uint8)])
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()
