"""The vLLM adapter: vLLM's connector surface and media_io_kwargs in, handles out, and `to_vllm`
giving the objects vLLM's fetch methods return (its rules, re-derived here with Pillow and numpy;
benchmarks/parity_vllm.py compares against vLLM itself where it is installed)."""
import base64
import io

import numpy as np
import pytest
from PIL import Image

import lazymedia
from lazymedia import samples
from lazymedia.integrations.vllm import VllmMediaConnector, to_vllm


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


@pytest.fixture
def connector():
    connector = VllmMediaConnector()
    yield connector
    connector.close()


def vllm_rgb(image: Image.Image, background=(255, 255, 255)) -> np.ndarray:
    """vLLM 0.33's convert_image_mode(image, "RGB"): transparency pasted over the background
    through the alpha mask, other modes through convert."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        out = Image.new("RGB", rgba.size, background)
        out.paste(rgba, mask=rgba.split()[3])
        return np.asarray(out)
    return np.asarray(image.convert("RGB"))


def test_transparent_png_composited_as_vllm_does(connector):
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (24, 32, 4), dtype=np.uint8)
    rgba[0, 0] = (255, 0, 0, 0)  # fully transparent red: white after vLLM's paste
    png = samples.encode_image(rgba, "PNG")
    handle = connector.fetch_image(data_url(png, "image/png"))
    assert not handle.is_decoded  # fetched and keyed, not decoded
    image = to_vllm(handle)
    assert isinstance(image, Image.Image) and image.mode == "RGB"
    expected = vllm_rgb(Image.open(io.BytesIO(png)))
    assert np.array_equal(np.asarray(image), expected) and tuple(expected[0, 0]) == (255, 255, 255)
    grey = VllmMediaConnector(media_io_kwargs={"image": {"rgba_background_color": [0, 128, 0]}})
    assert np.array_equal(np.asarray(to_vllm(grey.fetch_image(data_url(png, "image/png")))),
                          vllm_rgb(Image.open(io.BytesIO(png)), (0, 128, 0)))
    grey.close()
    kept = connector.fetch_image(data_url(png, "image/png"), image_mode=None)
    assert to_vllm(kept).mode == "RGBA" and np.array_equal(np.asarray(to_vllm(kept)), rgba)


def test_video_defaults_are_vllms(connector):
    clip = samples.video(frames=100, height=48, width=64)
    handle = connector.fetch_video(data_url(clip, "video/mp4"))
    frames, metadata = to_vllm(handle)
    expected = np.linspace(0, 99, 32).astype(int).tolist()  # num_frames=32, linspace truncated
    assert metadata["frames_indices"] == expected and frames.shape == (32, 48, 64, 3)
    assert metadata["total_num_frames"] == 100 and metadata["video_backend"] == "opencv"
    assert set(metadata) == {"total_num_frames", "fps", "duration", "video_backend", "frames_indices",
                             "do_sample_frames"}
    eight = VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 8, "video_backend": "pyav"}})
    assert eight.video_spec() == {"num_frames": 8, "fps": None, "decoder": "pyav", "sampler": "uniform"}
    frames, metadata = to_vllm(eight.fetch_video(data_url(clip, "video/mp4")))
    assert metadata["frames_indices"] == [0, 14, 28, 42, 56, 70, 84, 99] and metadata["video_backend"] == "pyav"
    eight.close()


def test_audio_is_mono_at_the_native_rate(connector):
    wav = samples.tone(seconds=0.5, rate=22050, channels=2)
    waveform, rate = to_vllm(connector.fetch_audio(data_url(wav, "audio/wav")))
    assert rate == 22050 and waveform.ndim == 1 and waveform.dtype == np.float32 and len(waveform) == 11025


def test_unsupported_options_are_refused_at_start_up():
    with pytest.raises(ValueError, match="frame_recovery"):
        VllmMediaConnector(media_io_kwargs={"video": {"frame_recovery": True}})
    with pytest.raises(ValueError, match="video_backend"):
        VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "torchcodec"}})


def test_a_processor_sees_vllms_objects_and_hits_skip_the_decode(connector):
    jpeg = samples.jpeg(64, 96)
    seen = []

    def process(decoded):
        images = [to_vllm(d) for d in decoded]
        seen.extend(images)
        return [image.size for image in images]

    processor = lazymedia.Processor(process)
    first = processor.apply([connector.fetch_image(data_url(jpeg, "image/jpeg"))])
    again = connector.fetch_image(data_url(jpeg, "image/jpeg"))
    assert processor.apply([again]) == first == [(96, 64)]
    assert len(seen) == 1 and not again.is_decoded
    assert np.array_equal(np.asarray(seen[0]), np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))
    processor.close()


def test_allowed_media_domains_match_exactly_as_in_vllm():
    connector = VllmMediaConnector(allowed_media_domains=["s3.amazonaws.com"])
    with pytest.raises(lazymedia.InvalidMediaError, match="not an allowed domain"):
        connector.fetch_image("https://attacker-bucket.s3.amazonaws.com/cat.jpg")
    connector.close()
    wide = lazymedia.MediaConnector(allowed_domains=["example.com"])  # lazymedia's own default: subdomains too
    assert wide.allow_subdomains
    wide.close()


def test_vllm_call_signatures_and_decoded_inputs(connector):
    clip = samples.video(frames=30)
    frames, _ = to_vllm(connector.fetch_video(video_url=data_url(clip, "video/mp4"), image_mode="RGB"))
    assert frames.shape[0] == 30  # fewer frames than num_frames=32: every frame
    # vLLM passes the model's video processor on every call; without vLLM's registry (or with a
    # configured video_backend) it changes nothing.
    frames, metadata = to_vllm(connector.fetch_video(data_url(clip, "video/mp4"),
                                                     video_processor="LlavaOnevisionVideoProcessor"))
    assert frames.shape[0] == 30 and metadata["video_backend"] == "opencv"
    configured = VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "pyav"}})
    assert configured.video_spec("RGB", "Qwen2VLVideoProcessor")["decoder"] == "pyav"
    configured.close()
    pil = Image.fromarray(samples.photo(8, 8)).convert("P")
    embeds = np.zeros((5, 16), np.float32)
    assert to_vllm(pil) is pil and to_vllm(embeds) is embeds  # passed on as vLLM passes them
