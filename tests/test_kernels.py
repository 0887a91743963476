"""The shared host/device kernels, host build, against numpy / Pillow references."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from lazymedia import _C, memory, ops

from conftest import make_image

PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def pillow_resize(array, size, filt):
    image = Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
    out = np.asarray(image.resize((size[1], size[0]), PIL_FILTERS[filt]))
    return out.reshape(size[0], size[1], array.shape[2])


@pytest.mark.parametrize("filt", ["bilinear", "bicubic"])
@pytest.mark.parametrize("channels", [1, 3])
def test_resize_single_axis_is_exactly_pillow(filt, channels):
    img = make_image(90, 130)[:, :, :channels].copy()
    for size in [(90, 40), (90, 301), (33, 130), (250, 130)]:
        ours = ops.resize(torch.from_numpy(img), size, filt).numpy()
        np.testing.assert_array_equal(ours, pillow_resize(img, size, filt))


@pytest.mark.parametrize("filt", ["bilinear", "bicubic"])
def test_resize_equals_pillow_on_random_sizes(filt):
    rng = np.random.default_rng(7)
    for trial in range(80):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 260, 4))
        channels = int(rng.choice([1, 3]))
        img = make_image(h, w, seed=trial)[:, :, :channels].copy()
        ours = ops.resize(torch.from_numpy(img), (oh, ow), filt).numpy()
        np.testing.assert_array_equal(ours, pillow_resize(img, (oh, ow), filt), err_msg=str((h, w, oh, ow)))


def test_resize_pass_order_cases():
    """Both sides of Pillow 13's vertical-first rule (height loses > 2x the columns width loses)."""
    for h, w, oh, ow in [(300, 100, 100, 90), (300, 100, 250, 90), (100, 300, 90, 100), (37, 53, 11, 97)]:
        img = make_image(h, w)
        for filt in ("bilinear", "bicubic"):
            np.testing.assert_array_equal(
                ops.resize(torch.from_numpy(img), (oh, ow), filt).numpy(), pillow_resize(img, (oh, ow), filt)
            )


def test_resize_threads_do_not_change_pixels():
    img = torch.from_numpy(make_image(600, 500))
    assert torch.equal(ops.resize(img, (223, 311), threads=1), ops.resize(img, (223, 311), threads=2))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_matches_pillow_transpose(orientation):
    img = make_image(7, 11, seed=orientation)
    methods = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_270,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }
    expected = np.asarray(Image.fromarray(img).transpose(methods[orientation])) if orientation > 1 else img
    np.testing.assert_array_equal(ops.orient(torch.from_numpy(img), orientation).numpy(), expected)


def float_yuv_reference(y, u, v, matrix, full_range):
    kr, kb = (0.2126, 0.0722) if matrix == "bt709" else (0.299, 0.114)
    kg = 1 - kr - kb
    y = y.astype(np.float64)
    u = u.astype(np.float64) - 128
    v = v.astype(np.float64) - 128
    if not full_range:
        y = (y - 16) * 255 / 219
        u = u * 255 / 224
        v = v * 255 / 224
    r = y + 2 * (1 - kr) * v
    g = y - 2 * kb * (1 - kb) / kg * u - 2 * kr * (1 - kr) / kg * v
    b = y + 2 * (1 - kb) * u
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255)


@pytest.mark.parametrize("matrix", ["bt601", "bt709"])
@pytest.mark.parametrize("full_range", [False, True])
@pytest.mark.parametrize("height,width", [(16, 16), (7, 9)])
def test_yuv_to_rgb_within_one_lsb(matrix, full_range, height, width):
    rng = np.random.default_rng(3)
    ch, cw = (height + 1) // 2, (width + 1) // 2
    stride = width + 5  # padded rows, as decoders hand them out
    y = rng.integers(0, 256, (height, stride), dtype=np.uint8)
    u = rng.integers(0, 256, (ch, cw), dtype=np.uint8)
    v = rng.integers(0, 256, (ch, cw), dtype=np.uint8)
    uv = np.zeros((ch, stride + stride % 2), dtype=np.uint8)
    uv[:, 0 : 2 * cw : 2], uv[:, 1 : 2 * cw : 2] = u, v
    up = np.repeat(np.repeat(u, 2, 0), 2, 1)[:height, :width]
    vp = np.repeat(np.repeat(v, 2, 0), 2, 1)[:height, :width]
    expected = float_yuv_reference(y[:, :width], up, vp, matrix, full_range)
    nv12 = ops.nv12_to_rgb(torch.from_numpy(y), torch.from_numpy(uv), width, matrix, full_range).numpy()
    i420 = ops.i420_to_rgb(
        torch.from_numpy(y), torch.from_numpy(u), torch.from_numpy(v), width, matrix, full_range
    ).numpy()
    assert np.abs(nv12 - expected).max() <= 1.0
    np.testing.assert_array_equal(nv12, i420)


def test_bt709_limited_range_known_values():
    y = torch.tensor([[16, 235]], dtype=torch.uint8)
    uv = torch.tensor([[128, 128]], dtype=torch.uint8)
    rgb = ops.nv12_to_rgb(y, uv, 2, "bt709", False)
    assert rgb.tolist() == [[[0, 0, 0], [255, 255, 255]]]


def test_layout_and_normalisation():
    img = torch.from_numpy(make_image(5, 6))
    chw = ops.to_chw(img)
    assert torch.equal(chw, img.permute(2, 0, 1))
    assert torch.equal(ops.to_hwc(chw), img)
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    expected = (
        img.permute(2, 0, 1).double() / 255 - torch.tensor(mean, dtype=torch.float64)[:, None, None]
    ) / torch.tensor(std, dtype=torch.float64)[:, None, None]
    assert torch.allclose(ops.to_chw_normalized(img, mean, std).double(), expected, atol=1e-5)
    with pytest.raises(ValueError):
        ops.to_chw_normalized(img, mean, [1.0, 0.0, 1.0])


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.orient(torch.zeros((2, 2, 3), dtype=torch.uint8), 9),
        lambda: ops.resize(torch.zeros((2, 2, 3), dtype=torch.uint8), (0, 3)),
        lambda: ops.resize(torch.zeros((2, 2, 7), dtype=torch.uint8), (3, 3)),
        lambda: ops.nv12_to_rgb(torch.zeros((4, 4), dtype=torch.uint8), torch.zeros((1, 4), dtype=torch.uint8), 4),
        lambda: ops.nv12_to_rgb(
            torch.zeros((4, 4), dtype=torch.uint8), torch.zeros((2, 4), dtype=torch.uint8), 4, "bt2020"
        ),
    ],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises((ValueError, RuntimeError)):
        call()


def test_wrong_dtype_is_type_error():
    with pytest.raises(TypeError):
        ops.resize(torch.zeros((2, 2, 3), dtype=torch.float32), (3, 3))


def test_host_buffer_pool_reuses_and_views_without_copy():
    pool = memory.HostBufferPool(max_cached_bytes=1 << 24)
    available, reason = memory.pinned_memory_available()
    assert pool.pinned == available and (available or reason)
    t = pool.empty((64, 64, 3))
    t.fill_(7)
    ptr = t.data_ptr()
    assert t.shape == (64, 64, 3) and t.dtype == torch.uint8
    del t
    again = pool.empty((60, 64, 3))
    assert again.data_ptr() == ptr  # the freed buffer came back
    stats = pool.stats()
    assert stats["allocations"] == 1 and stats["reuses"] == 1
    floats = pool.empty((10, 10), dtype=torch.float32)
    floats.fill_(1.5)
    assert floats.sum().item() == 150.0
    assert pool.empty((0, 3)).numel() == 0


@pytest.mark.parametrize("background", [(255, 255, 255), (0, 0, 0), (12, 200, 77)])
def test_alpha_composite_equals_pillows_masked_paste_for_every_value_and_alpha(background):
    from PIL import Image

    value, alpha = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    rgba = np.stack([value, 255 - value, value // 2, alpha], axis=2).astype(np.uint8)
    reference = Image.new("RGB", (256, 256), background)
    image = Image.fromarray(rgba, "RGBA")
    reference.paste(image, mask=image.split()[3])
    buffer = rgba.reshape(-1).copy()
    _C.pack_alpha(buffer, 256 * 256, 4, background)  # in place: 4 bytes a pixel in, 3 out
    np.testing.assert_array_equal(buffer[: 256 * 256 * 3].reshape(256, 256, 3), np.asarray(reference))


def test_alpha_dropped_and_gray_widened_in_place():
    rng = np.random.default_rng(3)
    la = rng.integers(0, 256, (37, 41, 2), dtype=np.uint8)
    buffer = np.zeros(37 * 41 * 3, np.uint8)
    buffer[: la.size] = la.reshape(-1)
    _C.pack_alpha(buffer, 37 * 41, 2)
    np.testing.assert_array_equal(buffer[: 37 * 41], la[:, :, 0].reshape(-1))
    _C.gray_to_rgb(buffer, 37 * 41)
    np.testing.assert_array_equal(buffer.reshape(37, 41, 3), np.repeat(la[:, :, :1], 3, axis=2))
    with pytest.raises(ValueError):
        _C.pack_alpha(buffer, 37 * 41, 3)  # only 2 or 4 channels carry an alpha
    with pytest.raises(ValueError):
        _C.gray_to_rgb(buffer[::2], 10)  # not contiguous
    with pytest.raises(ValueError):
        _C.pack_alpha(np.zeros(10, np.uint8), 100, 4)  # too small for the pixels


NO_THREADS_CHILD = """
import resource, threading
import numpy as np
from lazymedia import _C

rng = np.random.default_rng(0)
src = rng.integers(0, 256, (1536, 1024, 3), np.uint8)
mean, std = np.full(3, 0.5, np.float32), np.full(3, 0.25, np.float32)
outputs = {"resize": np.empty((700, 900, 3), np.uint8), "orient": np.empty((1024, 1536, 3), np.uint8),
           "to_chw": np.empty((3, 1536, 1024), np.uint8), "to_chw_normalized": np.empty((3, 1536, 1024), np.float32)}

def run(threads):
    _C.resize(src, outputs["resize"], "bicubic", threads)
    _C.orient(src, outputs["orient"], 6, threads)
    _C.to_chw(src, outputs["to_chw"], threads)
    _C.to_chw_normalized(src, outputs["to_chw_normalized"], mean, std, threads)

run(1)
expected = {name: out.copy() for name, out in outputs.items()}
for out in outputs.values():
    out.fill(0)
size = next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmSize:"))
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_NPROC, (1, resource.getrlimit(resource.RLIMIT_NPROC)[1]))  # root ignores it
for room in (4, 12, 20):  # MB of address space: no 8 MB thread stack, then one, then two (the rest fail)
    resource.setrlimit(resource.RLIMIT_AS, (size + (room << 20), hard))
    if room == 4:
        try:
            threading.Thread(target=print).start()
            print("a thread started")
        except RuntimeError:
            print("no thread can start")
    run(8)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    print("equal" if all(np.array_equal(outputs[name], expected[name]) for name in expected) else "different")
    for out in outputs.values():
        out.fill(0)
"""


def test_kernels_finish_on_the_calling_thread_when_no_thread_can_start():
    """parallel_rows under RLIMIT_AS (and RLIMIT_NPROC): a thread that cannot start used to
    unwind past joinable threads into std::terminate; now the calling thread runs its rows."""
    result = subprocess.run([sys.executable, "-c", NO_THREADS_CHILD], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["no", "thread", "can", "start", "equal", "equal", "equal"], result.stdout
