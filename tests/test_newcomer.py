"""The first hour of a serving engineer (issue 22), one test per sting: defaults that match vLLM,
errors that name the fix, no silent coercion, str paths, the command line, the README's set-up,
types for checkers. Each test fails if its sting returns."""

import ast
import base64
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import lazymedia
from lazymedia import synthetic
from lazymedia.spec import AudioSpec, ImageSpec, VideoSpec

from conftest import REPO

CLIP = synthetic.video(frames=100)  # 96x160, 30 fps


# -- defaults ----------------------------------------------------------------------------------
def test_defaults_are_vllms():
    """vLLM 0.33: VideoMediaIO(num_frames=32), the default loader's linspace rule, no fps cap,
    max_duration 300; AudioMediaIO mono at the source rate; ImageMediaIO RGB over white, EXIF
    orientation applied."""
    assert (VideoSpec().num_frames, VideoSpec().fps, VideoSpec().max_duration, VideoSpec().sampler) == (
        32,
        None,
        300.0,
        "uniform",
    )
    assert (AudioSpec().sample_rate, AudioSpec().mono) == (None, True)
    assert (ImageSpec().mode, ImageSpec().background, ImageSpec().apply_orientation) == ("RGB", (255, 255, 255), True)
    frames = lazymedia.load_video(CLIP).media
    assert frames.indices == [int(i * 99 / 31) for i in range(32)]  # np.linspace(0, 99, 32) truncated
    assert lazymedia.load_audio(synthetic.tone(seconds=0.1, rate=8000, channels=2)).media.samples.shape == (1, 800)


def test_a_long_clip_loads_with_the_defaults_and_a_413_names_what_lowers_it():
    """A clip whose every frame is over the decoded-size limit loads with the defaults (32
    frames); asking for every frame is a 413 that names num_frames, fps and size."""
    clip = synthetic.video(frames=600, height=48, width=64)
    limits = lazymedia.Limits(max_decoded_bytes=100 * 48 * 64 * 3)  # room for 100 frames of 600
    assert lazymedia.load_video(clip, limits=limits).media.frames.shape[0] == 32
    with pytest.raises(lazymedia.MediaTooLargeError) as info:
        lazymedia.load_video(clip, num_frames=None, limits=limits)
    message = info.value.operator_message  # the client's message and the operator's hint
    for remedy in ("num_frames", "fps", "size", "Limits.max_decoded_bytes"):
        assert remedy in message, message
    assert "MiB" in message or "KiB" in message  # sizes as people read them


# -- no silent coercion ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "loader, setting, value, accepted",
    [
        ("audio", "mono", "no", "True or False"),
        ("audio", "mono", 1, "True or False"),
        ("audio", "sample_rate", 16000.5, "positive int"),
        ("audio", "sample_rate", 0, "positive int"),
        ("video", "num_frames", 2.7, "positive int"),
        ("video", "num_frames", True, "positive int"),
        ("video", "num_frames", -1, "None"),
        ("video", "fps", "2", "positive number"),
        ("video", "fps", float("nan"), "positive number"),
        ("video", "max_duration", 0, "positive number"),
        ("video", "decoder", "gstreamer", "'pyav'"),
        ("video", "size", (0, 5), "(height, width)"),
        ("video", "size", (2.5, 4), "(height, width)"),
        ("image", "mode", "CMYK", "'RGB'"),
        ("image", "resample", "lanczos", "'bicubic'"),
        ("image", "background", (0, 0), "three ints"),
        ("image", "background", (0, 0, 256), "three ints"),
        ("image", "apply_orientation", "yes", "True or False"),
        ("image", "draft", None, "True or False"),
    ],
)
def test_a_wrong_setting_is_a_400_naming_it_and_what_it_accepts(loader, setting, value, accepted):
    data = {"audio": synthetic.tone(seconds=0.1, rate=8000), "video": CLIP, "image": synthetic.jpeg(16, 16)}[loader]
    with pytest.raises(lazymedia.InvalidMediaError) as info:
        lazymedia.load(loader, data, **{setting: value})
    assert info.value.status_code == 400
    assert setting in str(info.value) and accepted in str(info.value), str(info.value)


def test_a_valid_setting_is_not_confused_with_an_equal_value_of_another_type():
    """1 == 1.0 == True: the spec cache must not hand num_frames=True the spec of num_frames=1."""
    assert lazymedia.load_video(CLIP, num_frames=1).spec.num_frames == 1
    with pytest.raises(lazymedia.InvalidMediaError):
        lazymedia.load_video(CLIP, num_frames=True)
    assert lazymedia.load_audio(synthetic.tone(seconds=0.1, rate=8000), mono=True).spec.mono is True
    with pytest.raises(lazymedia.InvalidMediaError):
        lazymedia.load_audio(synthetic.tone(seconds=0.1, rate=8000), mono=1)


def test_an_unknown_setting_lists_the_settings():
    with pytest.raises(lazymedia.InvalidMediaError, match="the settings are num_frames, fps"):
        lazymedia.load("video", CLIP, frames=8)


# -- errors name their remedy -----------------------------------------------------------------
class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_404():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/missing.jpg"
    server.shutdown()
    server.server_close()


def _fetch(url, **options):
    connector = lazymedia.MediaConnector(**options)
    try:
        return connector.fetch_sync("image", url)
    finally:
        connector.close()


def _released():
    item = lazymedia.load_image(synthetic.jpeg(8, 8))
    item.release_bytes()
    return item.decode()


def _not_cached():
    return lazymedia.Processor(lambda decoded: decoded).apply([lazymedia.LazyMedia.from_id("image", "never-sent")])


def _opencv_missing(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cv2" else real(name, *a))
    return lazymedia.load_video(CLIP, decoder="opencv")  # refused where the reader is chosen, not in VideoSpec


JPEG = synthetic.jpeg(64, 64)
TRUNCATED_MP4 = CLIP[: len(CLIP) // 3]

# One failure of each kind a caller meets: (what triggers it, its status, words naming the remedy in
# the client's message or, for a server setting, the operator's hint).
ERROR_TABLE = {
    "str path": (lambda tmp, mp: lazymedia.load_image("/etc/passwd"), 400, ["pathlib.Path", "from_base64"]),
    "not media": (lambda tmp, mp: lazymedia.load_image(b"plain text " * 20), 400, ["send JPEG, PNG"]),
    "not a video": (lambda tmp, mp: lazymedia.load_video(b"plain text " * 20), 400, ["send MP4"]),
    "corrupt video": (lambda tmp, mp: lazymedia.load_video(TRUNCATED_MP4).decode(), 422, ["re-encode"]),
    "corrupt image": (lambda tmp, mp: lazymedia.load_image(JPEG[:400]).decode(), 422, ["re-encode"]),
    "encoded bytes": (
        lambda tmp, mp: lazymedia.load_image(JPEG, limits=lazymedia.Limits(max_bytes=100)),
        413,
        ["Limits.max_bytes"],
    ),
    "image pixels": (
        lambda tmp, mp: lazymedia.load_image(JPEG, limits=lazymedia.Limits(max_pixels=100)),
        413,
        ["Limits.max_pixels", "(height, width)=(64, 64)"],
    ),
    "image output": (
        lambda tmp, mp: lazymedia.load_image(JPEG, limits=lazymedia.Limits(max_decoded_bytes=100)),
        413,
        ["size=(height, width)", "Limits.max_decoded_bytes"],
    ),
    "video seconds": (
        lambda tmp, mp: lazymedia.load_video(CLIP, limits=lazymedia.Limits(max_video_seconds=1)),
        413,
        ["Limits.max_video_seconds", "shorter clip"],
    ),
    "video frames": (
        lambda tmp, mp: lazymedia.load_video(CLIP, limits=lazymedia.Limits(max_video_frames=10)),
        413,
        ["Limits.max_video_frames"],
    ),
    "video output": (
        lambda tmp, mp: lazymedia.load_video(CLIP, limits=lazymedia.Limits(max_decoded_bytes=1000)),
        413,
        ["num_frames", "fps", "size"],
    ),
    "audio seconds": (
        lambda tmp, mp: lazymedia.load_audio(
            synthetic.tone(seconds=2.0, rate=8000), limits=lazymedia.Limits(max_audio_seconds=1)
        ),
        413,
        ["Limits.max_audio_seconds"],
    ),
    "audio output": (
        lambda tmp, mp: lazymedia.load_audio(
            synthetic.tone(seconds=1.0, rate=8000), sample_rate=48000, limits=lazymedia.Limits(max_decoded_bytes=1000)
        ),
        413,
        ["sample_rate", "Limits.max_decoded_bytes"],
    ),
    "bad base64": (lambda tmp, mp: lazymedia.from_base64("not base64!"), 400, ["standard base64"]),
    "opencv missing": (lambda tmp, mp: _opencv_missing(mp), 400, ["pip install opencv-python-headless", "pyav"]),
    "private address": (lambda tmp, mp: _fetch("http://127.0.0.1:9/x.jpg"), 400, ["allow_private_networks"]),
    "unreachable": (
        lambda tmp, mp: _fetch("http://127.0.0.1:9/x.jpg", allow_private_networks=True),
        502,
        ["retry later"],
    ),
    "metadata address": (lambda tmp, mp: _fetch("http://169.254.169.254/latest"), 400, ["allow_private_networks"]),
    "domain": (
        lambda tmp, mp: _fetch("https://elsewhere.example/x.jpg", allowed_domains=["cdn.example.com"]),
        400,
        ["allowed_domains"],
    ),
    "scheme": (lambda tmp, mp: _fetch("ftp://cdn.example.com/x.jpg"), 400, ["use http(s), data: or file:"]),
    "file: off": (lambda tmp, mp: _fetch(f"file://{tmp}/x.jpg"), 400, ["allowed_local_path"]),
    "file: outside": (
        lambda tmp, mp: _fetch("file:///etc/hostname", allowed_local_path=tmp),
        400,
        ["allowed_local_path"],
    ),
    "file: directory": (
        lambda tmp, mp: _fetch(f"file://{tmp}/folder", allowed_local_path=tmp),
        400,
        ["a directory, not a file", "name a file"],
    ),
    "file: symlink": (
        lambda tmp, mp: _fetch(f"file://{tmp}/link/x.jpg", allowed_local_path=tmp),
        400,
        ["symbolic link", "name the file itself"],
    ),
    "file: missing": (
        lambda tmp, mp: _fetch(f"file://{tmp}/absent.jpg", allowed_local_path=tmp),
        400,
        ["no such file below the folder"],
    ),
    "data: too big": (
        lambda tmp, mp: _fetch("data:image/jpeg;base64," + base64.b64encode(JPEG).decode(), max_bytes=100),
        413,
        ["max_bytes"],
    ),
    "not cached": (lambda tmp, mp: _not_cached(), 400, ["send the media itself"]),
    "released": (lambda tmp, mp: _released(), 500, ["release_bytes()"]),
}


@pytest.mark.parametrize("kind", list(ERROR_TABLE))
def test_every_error_names_its_remedy(kind, tmp_path, monkeypatch):
    (tmp_path / "folder").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.jpg").write_bytes(JPEG)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    trigger, status, remedies = ERROR_TABLE[kind]
    with pytest.raises(lazymedia.MediaError) as info:
        trigger(str(tmp_path), monkeypatch)
    message = info.value.operator_message
    assert info.value.status_code == status, message
    for remedy in remedies:
        assert remedy in message, message
    assert not re.search(r"\[Errno -?\d+\]", message), message  # FFmpeg's or the OS's raw errno text


def test_an_upstream_error_says_what_to_do(http_404):
    with pytest.raises(lazymedia.MediaFetchError) as info:
        _fetch(http_404, allow_private_networks=True)
    assert info.value.status_code == 400 and "404" in str(info.value) and "check the URL" in str(info.value)


# -- torchvision / torchcodec habits ------------------------------------------------------------
def test_a_path_loads_and_the_repr_says_height_then_width(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(synthetic.jpeg(48, 64))
    item = lazymedia.load_image(path)
    assert "(height, width)=(48, 64)" in repr(item)
    assert tuple(item.media.shape) == (48, 64, 3)
    audio = lazymedia.load_audio(synthetic.tone(seconds=0.1, rate=8000)).media
    assert audio.data is audio.samples  # torchcodec's name


# -- the command line ---------------------------------------------------------------------------
def _cli(*args, **options):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lazymedia", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
        **options,
    )


@pytest.mark.parametrize(
    "argv", [["--size", "0x5"], ["--num-frames", "-1"], ["--num-frames", "0"], ["--fps", "-2"], ["--sample-rate", "0"]]
)
def test_bad_option_values_exit_2(argv, tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(CLIP)
    result = _cli("decode", *argv, str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_a_closed_pipe_ends_quietly():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        f"{sys.executable} -m lazymedia info | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert result.stdout.startswith("lazymedia ") and result.stderr == "", result.stderr


def test_info_lists_opencv():
    result = _cli("info")
    assert result.returncode == 0 and "OpenCV: " in result.stdout


def _options_without_help(help_text: str) -> list[str]:
    """Options argparse lists with no help text: an invocation line whose next line is another
    invocation (help goes on the same line, or indented further on the next)."""
    lines = [line for line in help_text.splitlines() if line.strip()]
    missing = []
    in_options = False
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            in_options = line in ("options:", "positional arguments:")
            continue
        if not in_options or not line.startswith("  ") or line.startswith("   "):
            continue
        if "  " in line.strip():
            continue  # help on the same line
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not following.startswith("   "):
            missing.append(line.strip())
    return missing


@pytest.mark.parametrize("command", ["decode", "info", "hash-threads"])
def test_every_option_has_help(command):
    result = _cli(command, "--help")
    assert result.returncode == 0
    assert _options_without_help(result.stdout) == [], result.stdout


# -- the README's set-up ------------------------------------------------------------------------
def test_readme_commands_make_a_venv_and_explain_the_torch_pin():
    readme = (REPO / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "pip install -e" in line and line.startswith("python3")]
    assert len(commands) == 2
    for command in commands:  # an old Python is refused before torch is installed
        assert command.startswith(
            "python3 -m venv .venv && . .venv/bin/activate && python -c 'import sys; assert sys.version_info >= (3, 11)"
        )
        assert "&& pip install torch==2.13.0 && pip install -e " in command
    assert "CPU build" in readme and "CUDA build" in readme and "GPU server" in readme
    assert "199 MB" in readme and "hash-threads" in readme


def test_pytest_q_shows_the_corpus_line():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_public_api.py::test_all_is_pinned_and_every_name_resolves",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout
    assert re.search(r"^corpus: ", result.stdout, re.MULTILINE), result.stdout


# -- types for checkers -------------------------------------------------------------------------
def test_every_lazily_imported_name_is_visible_to_type_checkers():
    """Names __getattr__ imports on first use are imported under TYPE_CHECKING too, so a
    checker sees classes, not Any (tests/test_public_api.py, checked by mypy, uses them)."""
    for package in ("lazymedia", "lazymedia.cache"):
        probe = subprocess.run(
            [sys.executable, "-c", f"import {package} as p; print(' '.join(n for n in p.__all__ if n not in vars(p)))"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        lazy = set(probe.stdout.split())
        assert lazy, probe.stderr
        source = REPO / Path(*package.split(".")) / "__init__.py"
        typed = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                typed |= {
                    alias.asname or alias.name
                    for stmt in node.body
                    if isinstance(stmt, ast.ImportFrom)
                    for alias in stmt.names
                }
        assert lazy <= typed, (package, lazy - typed)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"tests/test_public_api.py"' in pyproject  # mypy checks the typed use of the API
