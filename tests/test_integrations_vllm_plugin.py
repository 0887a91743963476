"""The "lazymedia" vLLM plugin inside vLLM 0.33's own code: registry, parser, hasher, processor
cache, loaders and error responses, each compared with vLLM's default connector on the same
inputs. vLLM answers by exception type (vllm/entrypoints/serve/exception_handling/error_response.py:
VLLMUnprocessableEntityError 422, other ValueErrors 400, NotImplementedError 501, the rest 500),
so the errors are checked by type. Needs vLLM importable (installed --no-deps, see benchmarks/vllm_media_tests.py) and
OpenCV (vLLM's video loaders); skips without them."""

import base64
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest

from lazymedia import synthetic
from lazymedia.errors import MediaError, MediaFetchError

pytest.importorskip("vllm.multimodal.media", reason="vLLM is not installed (benchmarks/vllm_media_tests.py runs these)")
pytest.importorskip("cv2", reason="vLLM's video loaders need opencv-python-headless")

from vllm.connections import MediaRequestDownloadBudget
from vllm.exceptions import VLLMUnprocessableEntityError
from vllm.multimodal.cache.base import MultiModalProcessorOnlyCache
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaDecodedBudget, MediaWithBytes
from vllm.multimodal.parse import MultiModalDataParser
from vllm.multimodal.processing.inputs import ProcessorInputs

from lazymedia.integrations import vllm_plugin
from lazymedia.integrations.vllm_plugin import register

from conftest import corpus_bytes, corpus_rows

REPO = Path(__file__).resolve().parent.parent


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def connector(name: str, **kwargs):
    """A connector built as vLLM's chat parser builds one (content_parser.py:152-159)."""
    register()
    options = {
        "media_io_kwargs": None,
        "allowed_local_media_path": "",
        "allowed_media_domains": None,
        "decoded_budget": MediaDecodedBudget(),
        "download_budget": MediaRequestDownloadBudget(),
    }
    return MEDIA_CONNECTOR_REGISTRY.load(name, **{**options, **kwargs})


def decodes() -> dict:
    return dict(vllm_plugin.DECODES)


@pytest.fixture(scope="module")
def clips():
    """(name, data: URL) of clips whose loaders' rules differ: 100 frames at 30 fps, 451 at 30
    (the float32 step that reaches the end), 61 at 25, 9 at 5 (fewer than the minimum frames)."""
    shapes = [(100, 30), (451, 30), (61, 25), (9, 5)]
    return [
        (f"{frames}@{fps}", data_url(synthetic.video(frames=frames, fps=fps, height=48, width=64), "video/mp4"))
        for frames, fps in shapes
    ]


def test_the_entry_point_registers_the_connector_under_vllms_setting():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"]["lazymedia"] == "lazymedia.integrations.vllm_plugin:register"
    # Installed beside an existing vLLM (README): no extra pulls vLLM and its pins.
    assert not any(dep.startswith("vllm") for deps in project["optional-dependencies"].values() for dep in deps)
    register()
    register()  # vLLM calls it in every process, and again in one process: idempotent
    built = connector("lazymedia")
    assert isinstance(built, vllm_plugin.LazymediaVllmConnector)
    built = MEDIA_CONNECTOR_REGISTRY.load(
        "lazymedia", media_io_kwargs={}, allowed_local_media_path="", allowed_media_domains=None
    )  # the decisions endpoint's arguments
    assert built.lazy is not None


def test_images_hash_as_vllms_and_a_processor_cache_hit_never_decodes():
    rgba = np.dstack([synthetic.photo(48, 64), np.full((48, 64), 128, np.uint8)])
    urls = [data_url(synthetic.jpeg(48, 64), "image/jpeg"), data_url(synthetic.encode_image(rgba, "PNG"), "image/png")]
    parser = MultiModalDataParser()

    def request(name):
        items = parser.parse_mm_data({"image": [connector(name).fetch_image(url) for url in urls]})
        return items, ProcessorInputs(prompt=[0], mm_data_items=items).get_mm_hashes("model", "blake3")

    vllm_items, vllm_hashes = request("http")
    before = decodes()
    items, hashes = request("lazymedia")
    assert all(isinstance(item, MediaWithBytes) for item in items["image"].data)
    assert hashes == vllm_hashes  # the same keys as vLLM's eager images (bytes + io_config)
    assert decodes() == before  # fetched, parsed and hashed: nothing decoded
    # vLLM's processor cache; a miss is re-parsed as processor.py:1345-1384 (_get_cache_missing_items) does it.
    cache = MultiModalProcessorOnlyCache(
        types.SimpleNamespace(get_multimodal_config=lambda: types.SimpleNamespace(mm_processor_cache_gb=1))
    )

    def lookup(items, hashes):
        is_cached = cache.is_cached(hashes["image"])
        misses = [items["image"][i] for i, hit in enumerate(is_cached) if not hit]
        return is_cached, parser.parse_mm_data({"image": misses}) if misses else {}

    is_cached, missing = lookup(items, hashes)
    assert is_cached == [False, False]
    pixels = [np.asarray(image) for image in missing["image"].get_all()]  # what the HF processor reads
    assert decodes().get("image", 0) == before.get("image", 0) + 2
    for ours, theirs in zip(pixels, vllm_items["image"].get_all()):
        assert np.array_equal(ours, np.asarray(theirs))
    for digest in hashes["image"]:
        cache.get_and_update_item(({"pixel_values": np.zeros(4, np.float32)}, []), digest)
    # The same request again: fetch, parse, hash, cache lookup; every item hits.
    before = decodes()
    items, hashes = request("lazymedia")
    is_cached, missing = lookup(items, hashes)
    assert is_cached == [True, True] and not missing
    assert decodes() == before


@pytest.mark.parametrize(
    "processor", [None, "Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor", "Glm4vVideoProcessor", "Glm46VVideoProcessor"]
)
def test_every_video_processor_gets_vllms_frames_and_metadata(clips, processor):
    """qwen2_vl, qwen3_vl, opencv_dynamic and opencv are lazymedia's samplers; glm46v is vLLM's
    own loader behind the plugin: never a refusal where vLLM answers."""
    lazymedia_decodes = processor != "Glm46VVideoProcessor"
    for name, url in clips:
        theirs = connector("http").fetch_video(video_url=url, video_processor=processor)
        before = decodes().get("video", 0)
        ours = connector("lazymedia").fetch_video(video_url=url, video_processor=processor)
        assert decodes().get("video", 0) - before == int(lazymedia_decodes), name  # whose loader ran
        assert isinstance(ours, MediaWithBytes) and ours.original_bytes == theirs.original_bytes, name
        (frames, metadata), (vllm_frames, vllm_metadata) = ours.media, theirs.media
        assert metadata == vllm_metadata, name
        assert frames.dtype == vllm_frames.dtype and np.array_equal(frames, vllm_frames), name


@pytest.mark.parametrize(
    "codec,container,media_type", [("libx264", "mp4", "video/mp4"), ("mpeg4", "avi", "video/x-msvideo")]
)
def test_vllms_video_fetch_settings_give_vllms_frames_and_metadata(monkeypatch, codec, container, media_type):
    """The settings of vLLM's test_fetch_video_http(_with_dynamic_loader), on the forms of its two
    URLs (slow_traffic_small.mp4, H.264; vtest.avi, MPEG-4 Part 2 in AVI): those tests compare
    sync with async on one side only, so the sides are compared here, lazymedia decoding."""
    url = data_url(
        synthetic.video(frames=45, fps=10, height=48, width=64, codec=codec, container=container), media_type
    )
    settings = [({"num_frames": n}, None) for n in (-1, 32, 1800)]
    settings += [({"max_duration": d, "requested_fps": f}, "opencv_dynamic") for d in (1, 60) for f in (2, 24)]
    monkeypatch.setenv("LAZYMEDIA_VLLM_DECODED_CACHE_MB", "0")  # each fetch decodes: lazymedia's, counted
    for options, backend in settings:
        if backend:
            monkeypatch.setenv("VLLM_VIDEO_LOADER_BACKEND", backend)
        else:
            monkeypatch.delenv("VLLM_VIDEO_LOADER_BACKEND", raising=False)
        kwargs = {"media_io_kwargs": {"video": options}}
        theirs = connector("http", **kwargs).fetch_video(video_url=url).media
        before = decodes().get("video", 0)
        ours = connector("lazymedia", **kwargs).fetch_video(video_url=url).media
        assert decodes().get("video", 0) == before + 1, options
        assert ours[1] == theirs[1], options
        assert ours[0].dtype == theirs[0].dtype and np.array_equal(ours[0], theirs[0]), options


def test_repeated_videos_and_audio_are_decoded_once(clips):
    url = clips[0][1]
    wav = data_url(synthetic.tone(seconds=0.5, rate=8000), "audio/wav")
    first = connector("lazymedia").fetch_video(video_url=url)
    audio = connector("lazymedia").fetch_audio(wav)
    before = decodes()
    first.media[0][:] = 0  # a processor writing into its input
    first.media[1]["fps"] = -1.0
    again = connector("lazymedia").fetch_video(video_url=url)
    theirs = connector("http").fetch_video(video_url=url)
    assert np.array_equal(again.media[0], theirs.media[0]) and again.media[1] == theirs.media[1]
    waveform, rate = connector("lazymedia").fetch_audio(wav)
    assert decodes() == before
    vllm_waveform, vllm_rate = connector("http").fetch_audio(wav)
    assert rate == vllm_rate and waveform.dtype == vllm_waveform.dtype
    assert np.allclose(waveform, vllm_waveform, atol=1e-6) and np.array_equal(waveform, audio[0])


def test_what_lazymedia_leaves_to_vllm_is_served_by_vllm(caplog):
    rgba = np.dstack([synthetic.photo(24, 32), np.full((24, 32), 7, np.uint8)])
    url = data_url(synthetic.encode_image(rgba, "PNG"), "image/png")
    kept = connector("lazymedia", media_io_kwargs={"image": {"image_mode": None}}).fetch_image(url)
    assert np.array_equal(
        np.asarray(kept),
        np.asarray(connector("http", media_io_kwargs={"image": {"image_mode": None}}).fetch_image(url)),
    )
    assert np.asarray(kept).shape == (24, 32, 4)
    frames = [synthetic.jpeg(24, 32, seed=s) for s in range(3)]
    sequence = "data:video/jpeg;base64," + ",".join(base64.b64encode(f).decode() for f in frames)
    ours = connector("lazymedia").fetch_video(video_url=sequence)
    theirs = connector("http").fetch_video(video_url=sequence)
    assert ours.media[1] == theirs.media[1] and np.array_equal(ours.media[0], theirs.media[0])
    options = {"video": {"num_frames": 8, "frame_recovery": True}}  # an option lazymedia does not implement
    with caplog.at_level("WARNING", logger="lazymedia.integrations.vllm_plugin"):
        fallback = connector("lazymedia", media_io_kwargs=options)
        connector("lazymedia", media_io_kwargs=options)  # the next request: said once
    assert fallback.lazy is None
    assert len([r for r in caplog.records if "frame_recovery" in r.getMessage()]) == 1
    assert fallback.fetch_video(video_url=data_url(synthetic.video(frames=20), "video/mp4")).media[0].shape[0] == 8


def test_errors_answer_as_vllm_answers(tmp_path):
    corrupt = synthetic.jpeg(48, 64)[:300]  # a header, then nothing
    (tmp_path / "corrupt.jpg").write_bytes(corrupt)
    for url in (data_url(corrupt, "image/jpeg"), (tmp_path / "corrupt.jpg").as_uri()):
        with pytest.raises(ValueError, match="Failed to load image") as caught:
            np.asarray(connector("lazymedia", allowed_local_media_path=str(tmp_path)).fetch_image(url))
        assert isinstance(caught.value, MediaError)  # a ValueError: vLLM answers 400, as for its own
    missing = str(tmp_path / "absent")
    with pytest.raises(ValueError, match="does not exist") as caught:
        connector("lazymedia", allowed_local_media_path=missing)
    assert isinstance(caught.value, MediaError)
    with pytest.raises(RuntimeError, match="allowed-local-media-path") as caught:
        connector("lazymedia").fetch_image((tmp_path / "corrupt.jpg").as_uri())
    assert isinstance(caught.value, MediaError)  # vLLM's RuntimeError: 500, as vLLM answers
    # An upstream 404 (lazymedia's connector reports the upstream's client error as a 4xx).
    converted = vllm_plugin.vllm_error(MediaFetchError("upstream example.com answered 404", status_code=404), "image")
    assert isinstance(converted, VLLMUnprocessableEntityError) and isinstance(converted, MediaError)
    assert converted.status_code == 422 and converted.parameter == "image_url"
    assert str(converted).endswith("Failed to fetch media from URL: upstream example.com answered 404")
    # A transient failure (lazymedia's 502 and 504): vLLM's own connector lets it through as a 500;
    # the plugin answers its status, through vLLM's GracefulHTTPError.
    from vllm.exceptions import GracefulHTTPError

    transient = vllm_plugin.vllm_error(MediaFetchError("upstream example.com answered 503", status_code=502), "image")
    assert isinstance(transient, GracefulHTTPError) and isinstance(transient, MediaError)
    assert transient.http_status == 502 and transient.status_code == 502


def test_a_request_over_vllms_decoded_budget_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES", str(48 * 64 * 4 + 10))
    budget = MediaDecodedBudget()
    ours = connector("lazymedia", decoded_budget=budget)
    url = data_url(synthetic.jpeg(48, 64), "image/jpeg")
    ours.fetch_image(url)
    assert budget.used == 48 * 64 * 4  # charged from the header, as vLLM charges it, without a decode
    with pytest.raises(ValueError, match="VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES") as caught:
        ours.fetch_image(url)
    assert isinstance(caught.value, MediaError)


MIME = {"jpeg": "image/jpeg", "png": "image/png", "gif": "image/gif", "webp": "image/webp"}


def corpus_urls(kind: str) -> list[tuple[str, str]]:
    """(path, data: URL) of the corpus files of one kind that decode, up to 1 MB: tests/data's,
    and the external corpus's where it is beside the checkout (LAZYMEDIA_CORPUS)."""
    return [
        (row["path"], data_url(corpus_bytes(row), MIME.get(row["format"], f"{kind}/{row['format']}")))
        for row in corpus_rows(kind)
        if row["expected"] == "decodes" and int(row["bytes"]) <= 1 << 20
    ]


def test_corpus_images_key_and_decode_as_vllms():
    parser = MultiModalDataParser()
    compared = 0
    for path, url in corpus_urls("image"):
        sides = []
        for name in ("http", "lazymedia"):
            item = connector(name).fetch_image(url)
            items = parser.parse_mm_data({"image": [item]})
            digest = ProcessorInputs(prompt=[0], mm_data_items=items).get_mm_hashes("model", "blake3")["image"]
            sides.append((digest, np.asarray(item.media)))
        (vllm_digest, vllm_pixels), (digest, pixels) = sides
        assert digest == vllm_digest, path
        assert pixels.shape == vllm_pixels.shape and np.array_equal(pixels, vllm_pixels), path
        compared += 1
    assert compared >= 5


# An MP4 whose first sample is an edit list's pre-roll: OpenCV's frame count (vLLM's) includes it,
# lazymedia counts the frames a player shows (tests/test_codecs_video.py).
PRESENTED_FRAMES_DIFFER = {"video/pre_roll.mp4": (29, 30)}


@pytest.mark.parametrize("processor", [None, "Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor"])
def test_corpus_videos_are_vllms(processor):
    compared = 0
    for path, url in corpus_urls("video"):
        outcomes = []
        for name in ("http", "lazymedia"):
            try:
                outcomes.append(connector(name).fetch_video(video_url=url, video_processor=processor).media)
            except ValueError as exc:  # refused by both, or the test fails below
                outcomes.append(type(exc))
        theirs, ours = outcomes
        if isinstance(theirs, type) or isinstance(ours, type):
            assert isinstance(theirs, type) and isinstance(ours, type), (path, theirs, ours)
            continue
        if path in PRESENTED_FRAMES_DIFFER:  # docs/usage.md, the differences table
            assert (ours[1]["total_num_frames"], theirs[1]["total_num_frames"]) == PRESENTED_FRAMES_DIFFER[path]
            continue
        assert ours[1] == theirs[1], path
        assert np.array_equal(ours[0], theirs[0]), path
        compared += 1
    assert compared >= 1


class Tracker:
    """What vLLM's content parser reads of its item tracker (item_tracker.py), recording items."""

    def __init__(self, video_processor_name):
        self.media_io_kwargs, self.allowed_local_media_path, self.allowed_media_domains = None, "", None
        self.decoded_budget, self.download_budget = MediaDecodedBudget(), MediaRequestDownloadBudget()
        self.video_processor_name = video_processor_name
        self.items = []

    def add(self, modality, item):
        self.items.append((modality, item[0]))
        return f"<{modality}>"


@pytest.mark.parametrize("video_processor", ["Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor"])
def test_vllms_chat_content_parser_gets_vllms_items(monkeypatch, clips, video_processor):
    """OpenAI-style content parts through vLLM's own parser, once per VLLM_MEDIA_CONNECTOR."""
    from vllm.renderers.chat_utils.chat_message import parse_chat_message_content_part
    from vllm.renderers.chat_utils.content_parser import MultiModalContentParser

    wav = synthetic.tone(seconds=0.5, rate=16000)
    rgba = np.dstack([synthetic.photo(32, 48), np.full((32, 48), 100, np.uint8)])
    parts = [
        {"type": "image_url", "image_url": {"url": data_url(synthetic.jpeg(40, 56), "image/jpeg")}},
        {"type": "image_url", "image_url": {"url": data_url(synthetic.encode_image(rgba, "PNG"), "image/png")}},
        {"type": "video_url", "video_url": {"url": clips[1][1]}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": data_url(wav, "audio/wav")}},
    ]
    register()
    seen = {}
    for name in ("http", "lazymedia"):
        monkeypatch.setenv("VLLM_MEDIA_CONNECTOR", name)
        tracker = Tracker(video_processor)
        parser = MultiModalContentParser(tracker)
        for part in parts:
            parse_chat_message_content_part(
                part, parser, mm_tracker=tracker, wrap_dicts=False, interleave_strings=False
            )
        seen[name] = tracker.items
    assert [modality for modality, _ in seen["lazymedia"]] == [modality for modality, _ in seen["http"]]
    for (modality, ours), (_, theirs) in zip(seen["lazymedia"], seen["http"]):
        if modality == "image":
            assert isinstance(ours.media, vllm_plugin.LazyImage)  # lazymedia's connector served it
            assert ours.original_bytes == theirs.original_bytes and ours.io_config == theirs.io_config
            assert np.array_equal(np.asarray(ours.media), np.asarray(theirs.media))
        elif modality == "video":
            assert ours.media[1] == theirs.media[1] and np.array_equal(ours.media[0], theirs.media[0])
        else:
            assert ours[1] == theirs[1] and np.allclose(ours[0], theirs[0], atol=1e-6)


def test_a_malformed_private_network_setting_is_the_servers_error(monkeypatch):
    monkeypatch.setenv("LAZYMEDIA_ALLOW_PRIVATE_NETWORKS", "10.0.0.0/8,not-a-network")
    with pytest.raises(MediaError, match="misconfigured") as caught:
        connector("lazymedia")
    assert caught.value.status_code == 500 and not isinstance(caught.value, ValueError)  # vLLM: 500
    assert "LAZYMEDIA_ALLOW_PRIVATE_NETWORKS" in caught.value.hint  # for the operator, not the client


def test_vllms_plugin_loader_finds_the_entry_point_in_a_fresh_process(tmp_path):
    """The whole switch: vLLM's load_general_plugins() (run in every vLLM process) discovers the
    entry point pyproject.toml declares, and VLLM_MEDIA_CONNECTOR=lazymedia then names it.
    The entry point is installed the way pip writes it (a dist-info's entry_points.txt)."""
    import os
    import subprocess
    import sys

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["vllm.general_plugins"]["lazymedia"]
    dist = tmp_path / "lazymedia_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lazymedia-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\nlazymedia = {target}\n")
    code = (
        "import vllm.plugins, vllm.envs as envs\n"
        "vllm.plugins.load_general_plugins()\n"
        "from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY\n"
        "print(type(MEDIA_CONNECTOR_REGISTRY.load(envs.VLLM_MEDIA_CONNECTOR)).__name__)\n"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
        VLLM_PLUGINS="lazymedia",
        VLLM_MEDIA_CONNECTOR="lazymedia",
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "LazymediaVllmConnector"


def settings_module():
    """benchmarks/vllm_settings.py: the cases of vLLM's settings, the media server, the comparison."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("vllm_settings", REPO / "benchmarks" / "vllm_settings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SETTINGS = settings_module()


@pytest.fixture(scope="module")
def settings_rows():
    """Every case through both connectors, in one event loop (vLLM's HTTP client keeps one
    session for the loop that first used it)."""
    import asyncio

    return {row["case"]: row for row in asyncio.run(SETTINGS.compare(SETTINGS.CASES))}


@pytest.mark.parametrize("case", SETTINGS.CASES, ids=lambda case: case.name)
def test_vllms_settings_govern_the_plugin(settings_rows, case):
    """A request vLLM refuses under its settings is refused by the plugin with vLLM's answer
    (status and error type: the exception type vLLM's server maps), one vLLM serves is served."""
    row = settings_rows[case.name]
    assert row["vllm"]["result"] == case.vllm, row  # what vLLM 0.33 does, as the table says
    if case.plugin_answer is None:
        assert row["plugin"] == {**row["vllm"], "message": row["plugin"]["message"]}, row
    else:  # a documented difference: refused too, with the status docs/usage.md gives
        assert row["plugin"]["result"] == "refused"
        assert (row["plugin"]["status"], row["plugin"]["error_type"]) == case.plugin_answer
    if row["vllm"]["message"].startswith(("Image dimensions", "Video frame", "Audio", "Maximum file size")):
        assert (
            row["plugin"]["message"].split(": ", 1)[1] == row["vllm"]["message"].split(" (parameter=")[0]
            or "Audio exceeds" in row["vllm"]["message"]
        ), row  # vLLM's words (its duration message adds the rate)


def test_a_corrupt_image_reaches_the_client_as_failed_to_load(tmp_path):
    """The plugin's image decodes inside vLLM's processor call, whose wrapper answers the client
    "Failed to apply <processor> on data=..."; that text names the image's load failure."""
    from vllm.multimodal.processing.context import InputProcessingContext

    corrupt = synthetic.jpeg(48, 64)[:300]
    image = connector("lazymedia").fetch_image(data_url(corrupt, "image/jpeg")).media

    def processor(images, **kwargs):
        return np.asarray(images[0])

    context = types.SimpleNamespace(get_merged_mm_kwargs=lambda kwargs: {})
    with pytest.raises(ValueError, match="Failed to apply") as caught:
        InputProcessingContext.call_hf_processor(context, processor, {"images": [image]})
    assert "Failed to load image" in str(caught.value) and " at 0x" not in str(caught.value)
    assert isinstance(caught.value.__cause__, MediaError)


def test_a_refused_private_address_names_the_operators_setting(monkeypatch, caplog):
    monkeypatch.delenv("LAZYMEDIA_ALLOW_PRIVATE_NETWORKS", raising=False)
    with pytest.raises(MediaError) as caught:
        connector("lazymedia").fetch_image("http://127.0.0.1:9/image.jpg")
    assert "LAZYMEDIA_ALLOW_PRIVATE_NETWORKS" in caught.value.hint and "MediaConnector" not in caught.value.hint
    assert caught.value.__notes__ == [f"hint: {caught.value.hint}"]  # what a traceback shows
    assert "LAZYMEDIA_ALLOW_PRIVATE_NETWORKS" in caplog.text  # the operator's log says it once


def test_an_http_fetch_leaves_no_unclosed_session_at_exit(tmp_path):
    """aiohttp warns "Unclosed client session" at exit for a pool left open: the plugin closes
    the shared connectors' pools at exit, after sync and async fetches."""
    import os
    import subprocess
    import sys

    code = (
        "import asyncio, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import vllm_settings\n"
        "server = vllm_settings.MediaServer()\n"
        "url = server.url('http', 'jpeg_small')\n"
        "from lazymedia.integrations.vllm_plugin import register\n"
        "conn = vllm_settings.build('lazymedia')\n"
        "conn.fetch_image(url).media.load()\n"
        "async def main():\n"
        "    (await vllm_settings.build('lazymedia').fetch_image_async(url)).media.load()\n"
        "asyncio.run(main())\n"
        "server.close()\n"
        "print('fetched')\n"
    )
    env = dict(os.environ, LAZYMEDIA_ALLOW_PRIVATE_NETWORKS=SETTINGS.LOOPBACK, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "benchmarks")], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("fetched"), result.stderr[-2000:]
    assert "Unclosed" not in result.stderr, result.stderr[-2000:]


def test_a_lazy_image_reads_as_a_view_of_one_decode_and_still_works_as_a_pil_image():
    before = decodes().get("image", 0)
    image = connector("lazymedia").fetch_image(data_url(synthetic.jpeg(48, 64), "image/jpeg")).media
    array = np.asarray(image)  # how HF image processors read a PIL image
    assert array.shape == (48, 64, 3) and not array.flags.writeable  # read-only, as Pillow's
    assert np.shares_memory(array, np.asarray(image))  # views of one decode
    assert image.resize((32, 24)).size == (32, 24)  # any other PIL method: Pillow's image, built from it
    assert np.array_equal(np.asarray(image.convert("RGB")), array)
    assert decodes()["image"] == before + 1
