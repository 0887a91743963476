"""Decoding in child processes, for untrusted input: a decoder that crashes (a segfault in
FFmpeg on a hostile file) or hangs kills only its child, which is replaced, and the caller gets
a typed error.

Workers are fresh interpreters (`python -m lazymedia.engine._isolation`) talking over a socket
pair: no fork of a threaded server, and no re-import of the server's __main__ as
multiprocessing's spawn and forkserver would do. A worker warms up before it reports ready: it
imports torch and the decoders and decodes a tiny video and audio clip (seconds, where a warm
decode takes milliseconds: docs/benchmarks-history.md), so a pool created early (`DecodeEngine.warm_up`)
serves its first miss warm.

Decoded frames and samples of a MiB or more come back through shared memory: the worker writes
the tensor once into a file of the pool's folder in /dev/shm and replies with its name; the
parent maps it (the tensor's storage is that mapping) and unlinks it at once, where pickling
through the socket costs four copies (figures: docs/benchmarks.md). A worker that dies
leaves at most its own files, which are removed with it; the folder goes with the pool. Where
/dev/shm is not writable, everything is pickled.

Workers start on demand: the first isolated item starts one, and a call that finds none idle
starts another, up to `workers` (argument, or LAZYMEDIA_ISOLATION_WORKERS for the process-wide
pool); an image-only process never starts one. A worker whose parent is gone (closed, exited,
killed) sees its socket close and exits quietly, whatever it was doing.

Workers never initialise CUDA (LAZYMEDIA_NO_CUDA=1, no visible device): page-locked buffers would
create a CUDA context, about 0.5 GiB of device memory, in every worker. The serving process
reads a shared result into its own pinned frame buffers where it has a GPU, so frames leave the
pool ready for an asynchronous copy to the device; GPU decoders (NVDEC) run in the serving process.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import math
import os
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .._singletons import process_wide
from ..codecs.types import TensorResult
from ..errors import MediaCapacityError, MediaError, UnprocessableMediaError
from ..memory import NO_CUDA_ENV, HostBufferPool, frame_buffers
from ..metrics import count

if TYPE_CHECKING:
    import torch

    from ..spec import Limits, Spec
    from ._protocol import Decoded, Header

T = TypeVar("T")

logger = logging.getLogger("lazymedia.engine")

_READY = b"ready"
# Workers of the process-wide pool: each costs about 260 MB of RSS once warm (docs/usage.md).
WORKERS_VARIABLE = "LAZYMEDIA_ISOLATION_WORKERS"
DEFAULT_WORKERS = 4
# A worker imports torch and the decoders before it can serve: minutes would mean it is stuck.
_STARTUP_TIMEOUT_S = 120.0
# Decoded tensors at least this large come back through the pool's shared-memory folder.
SHARED_MIN_BYTES = 1 << 20


# A worker's reply carries (_SHARED, file name, the result) where its tensor was written to the
# pool's folder, the result holding a one-element stand-in of the tensor's shape and dtype. The
# marker is a string, not a class of this module, since the worker runs this module as __main__.
_SHARED = "lazymedia.engine._isolation/shared-tensor"


def _export(value: object, folder: Path | None, names: Iterator[int]) -> object:
    """Worker side: a result whose tensor is large, with that tensor written to `folder` (see _SHARED)."""
    if folder is None or not isinstance(value, TensorResult):
        return value
    import torch

    tensor = value.tensor
    if tensor.device.type != "cpu" or tensor.nbytes < SHARED_MIN_BYTES:
        return value
    name = f"{os.getpid()}-{next(names)}"
    try:
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:  # any dtype, as its bytes (numpy has no bfloat16)
            f.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    except (OSError, RuntimeError, TypeError):  # /dev/shm full (64 MiB in a default container)
        (folder / name).unlink(missing_ok=True)
        return value  # the tensor is pickled instead
    return _SHARED, name, value.with_tensor(torch.empty((), dtype=tensor.dtype).expand(tensor.shape))


def _import(value: object, folder: Path | None) -> object:
    """Parent side: a shared result's tensor mapped from its file, which is unlinked at once."""
    if not (isinstance(value, tuple) and len(value) == 3 and value[0] == _SHARED and folder is not None):
        return value
    import torch

    _, name, result = value
    shape, dtype = tuple(result.tensor.shape), result.tensor.dtype
    path = folder / name
    try:
        count = math.prod(shape)
        # torch.from_file creates and zero-fills a missing file: check it is the worker's, whole.
        if path.stat().st_size != count * result.tensor.element_size():
            raise OSError(f"shared result {name} is incomplete")
        pinned = result_buffers()
        if pinned is None:
            tensor = torch.from_file(str(path), shared=True, size=count, dtype=dtype).view(shape)
        else:  # one read into page-locked memory instead of a mapping
            tensor = pinned.empty(shape, dtype)
            with open(path, "rb") as f:
                if f.readinto(tensor.reshape(-1).view(torch.uint8).numpy().data) != tensor.nbytes:
                    raise OSError(f"shared result {name} is incomplete")
    finally:
        path.unlink(missing_ok=True)
    return result.with_tensor(tensor)


def result_buffers() -> HostBufferPool | None:
    """The serving process's pinned frame buffers where it has them (a GPU), else None."""
    pool = frame_buffers()
    return pool if pool.pinned else None


def _warm_up() -> dict[str, bool | float | str]:
    """Worker side, before it reports ready: the imports and codec set-up a first decode would
    pay, through a tiny video and audio decode. Returns what it did (the parent keeps it)."""
    import time

    started = time.perf_counter()
    from .. import synthetic
    from ..codecs import decode, probe
    from ..spec import DEFAULT_LIMITS, AudioSpec, VideoSpec

    def decoded(modality: str, data: bytes, spec: Spec) -> Any:  # the modality's result
        return decode(modality, data, probe(modality, data, DEFAULT_LIMITS, spec), spec)

    video = decoded("video", synthetic.video(frames=2, height=16, width=16), VideoSpec(num_frames=2))
    audio = decoded("audio", synthetic.tone(0.05, rate=8000, channels=1), AudioSpec(sample_rate=16000))
    warmed = all(name in sys.modules for name in ("torch", "av", "soundfile", "soxr"))
    return {
        "warm": warmed and video.frames.shape[0] == 2 and audio.samples.shape[-1] > 0,
        "seconds": time.perf_counter() - started,
    }


def _worker_main(conn: Connection, folder: Path | None = None) -> None:
    """Runs (fn, args) requests until the pipe closes; replies ("ok", value) or ("error", exc),
    large decoded tensors through `folder` (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    names = itertools.count()
    try:
        report = _warm_up()
    except Exception as exc:  # a broken codec install: the worker still serves, cold
        report = {"warm": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        conn.send_bytes(_READY + json.dumps(report).encode())
    except OSError:  # the parent closed the pool, exited or was killed during the warm-up
        return
    while True:
        try:
            fn, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", _export(fn(*args), folder, names))
        except BaseException as exc:  # everything goes back to the parent, typed there
            # the client's text stays generic (an exception's text may name paths or internals);
            # the operator's hint carries it
            reply = (
                "error",
                exc
                if isinstance(exc, MediaError)
                else UnprocessableMediaError(
                    "the decoder failed on this input", hint=f"decoder raised {type(exc).__name__}: {exc}"
                ),
            )
        try:
            conn.send_bytes(pickle.dumps(reply))
        except (OSError, ValueError, pickle.PicklingError):
            if folder is not None:  # nobody will map what this reply exported
                for leftover in folder.glob(f"{os.getpid()}-*"):
                    leftover.unlink(missing_ok=True)
            return


class _Worker:
    def __init__(self, folder: Path | None):
        parent, child = socket.socketpair()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            NO_CUDA_ENV: "1",
            "CUDA_VISIBLE_DEVICES": "",
        }  # see the module docstring
        command = [sys.executable, "-m", "lazymedia.engine._isolation", str(child.fileno()), str(folder or "")]
        self.process = subprocess.Popen(command, pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self.warm_up: dict[str, Any] = {}  # what the worker reported doing before it was ready (JSON)
        self.served = 0  # calls answered: a crash in a fresh worker is the input's own
        self._ready_lock = threading.Lock()

    def wait_ready(self) -> None:
        """Waits out the interpreter start and warm-up, which the decode time-out must not include."""
        with self._ready_lock:
            if not self.ready:
                message = self.conn.recv_bytes() if self.conn.poll(_STARTUP_TIMEOUT_S) else b""
                if not message.startswith(_READY):
                    raise OSError("decoder process did not start")
                try:
                    self.warm_up = json.loads(message[len(_READY) :])
                except ValueError:
                    self.warm_up = {}
                self.ready = True

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)
        self.conn.close()


def _closed_error() -> MediaCapacityError:
    """A call on a pool that closed (the server is shutting down): not the input's fault, a 503."""
    return MediaCapacityError("the decoder pool closed (the server is shutting down)")


class _WorkerDied(Exception):
    """A worker process ended while it held a call (its exit status as the message); `fresh`:
    it had served no earlier call, so nothing before this input touched its heap; `sent`: the
    request had reached it (a death before, while starting or idle, is never the input's)."""

    def __init__(self, status: str, fresh: bool, sent: bool = True):
        super().__init__(status)
        self.fresh = fresh
        self.sent = sent


def _start_failed(died: _WorkerDied) -> MediaCapacityError:
    """Two workers in a row died before the request reached them: the server's fault, a 503."""
    return MediaCapacityError(
        "the server could not start a decoder now: retry later",
        hint=f"isolation workers died while starting, twice (last: {died}): check the "
        "workers' stderr, memory limits (an OOM kill) and the Python environment",
    )


@dataclass(frozen=True)
class PoolStats:
    """A pool's workers: `workers` alive now, `peak` the most alive at once (never above `limit`),
    `started` ever, `restarts` those that died under a call or timed out and were replaced."""

    workers: int
    peak: int
    limit: int
    started: int
    restarts: int


class IsolatedPool:
    """Up to `workers` decoder processes, started on demand; `run(fn, *args, timeout_s=...)`
    executes fn(*args) in one of them. fn and its arguments must pickle (module-level functions,
    bytes, dataclasses)."""

    def __init__(self, workers: int = 2, timeout_s: float = 60.0, shared_memory: bool = True):
        if workers < 1:
            raise ValueError(f"an isolated pool needs at least 1 worker, got {workers}")
        self.workers = workers
        self.timeout_s = timeout_s
        self.shared_folder = _shared_folder() if shared_memory else None
        # Idle workers; None wakes a waiter to start a worker in a freed slot (or see the pool closed).
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._starting = 0
        self._peak = self._started = self._restarts = 0
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)  # workers stop with the process, closed or not

    def _take(self) -> _Worker:
        """An idle worker, or a new one while fewer than `workers` exist, else the next freed."""
        while True:
            with self._lock:
                if self._closed:
                    self._idle.put(None)  # wakes the next waiter, which sees it closed too
                    raise _closed_error()
                try:
                    worker = self._idle.get_nowait()
                except queue.Empty:
                    worker = None
                if worker is not None:
                    return worker
                grow = len(self._all) + self._starting < self.workers
                if grow:
                    self._starting += 1
            if grow:
                return self._spawn()
            worker = self._idle.get()
            if worker is not None:
                return worker

    def _spawn(self) -> _Worker:
        """Starts a worker in a slot `_take` or `warm_up` reserved."""
        try:
            worker = _Worker(self.shared_folder)
        except OSError as exc:  # no process could start (out of pids or memory): not the input's fault
            raise MediaCapacityError(
                "the server could not start a decoder now: retry later",
                hint=f"starting an isolation worker failed: {exc}",
            ) from None
        finally:
            with self._lock:
                self._starting -= 1
        with self._lock:
            self._all.append(worker)
            self._started += 1
            self._peak = max(self._peak, len(self._all))
            if self._closed:
                self._all.remove(worker)
        if self._closed:
            worker.kill()
            raise _closed_error()
        return worker

    def _replace(self, worker: _Worker, cause: str) -> None:
        """Ends a worker that died or timed out; the next call that needs one starts another."""
        try:
            worker.kill()
        except subprocess.TimeoutExpired:  # stuck in the kernel: left to the OS, never reused
            pass
        if self.shared_folder is not None:  # what the dead worker wrote and nobody mapped
            for leftover in self.shared_folder.glob(f"{worker.process.pid}-*"):
                leftover.unlink(missing_ok=True)
        with self._lock:
            if worker in self._all:  # close() may have taken it already
                self._all.remove(worker)
            closed = self._closed
            if not closed:
                self._restarts += 1
        if not closed:
            logger.warning("decoder worker %d ended: %s; the next call starts another", worker.process.pid, cause)
            count("worker_restarts", cause=cause)
            self._idle.put(None)

    def run(self, fn: Callable[..., T], *args: object, timeout_s: float | None = None) -> T:
        """fn(*args) in a worker. A worker that dies is replaced and the call retried once on
        another: a decoder's heap can be corrupted by an earlier hostile input and crash on a
        legal one (the mixed fuzz saw it), while an input that crashes a decoder by itself
        crashes the retry too and is a 422. A time-out is not retried. A worker that dies before
        the request reached it (while starting, or idle) says nothing of the input: the call is
        retried once on a new worker, and a second such death is a 503 (MediaCapacityError)."""
        try:
            return self._run_once(fn, args, timeout_s)
        except _WorkerDied as died:
            if self._closed:  # shutting down under the call: not the input's fault
                raise _closed_error() from None
            if died.sent and died.fresh:  # a worker that had decoded nothing else: the input crashed it alone
                raise UnprocessableMediaError(f"decoder process died ({died})") from None
        try:
            return self._run_once(fn, args, timeout_s)
        except _WorkerDied as died:
            if self._closed:
                raise _closed_error() from None
            if not died.sent:
                raise _start_failed(died) from None
            raise UnprocessableMediaError(f"decoder process died ({died})") from None

    def _run_once(self, fn: Callable[..., T], args: tuple[object, ...], timeout_s: float | None) -> T:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        worker: _Worker | None = self._take()
        assert worker is not None
        served = worker.served
        sent = False
        try:
            worker.wait_ready()
            worker.conn.send_bytes(pickle.dumps((fn, args)))
            sent = True
            if not worker.conn.poll(timeout):
                self._replace(worker, "timed out")
                worker = None
                raise UnprocessableMediaError(f"decoder timed out after {timeout:.0f} s", status_code=422)
            status, value = pickle.loads(worker.conn.recv_bytes())
            worker.served += 1
            if status == "ok":  # mapped while this call holds the worker: nothing can remove its files
                value = _import(value, self.shared_folder)
        except (EOFError, OSError):
            code = None
            if worker is not None:
                try:
                    code = worker.process.wait(1)
                except subprocess.TimeoutExpired:
                    pass
            status = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            if worker is not None:
                self._replace(worker, f"died ({status})")
                worker = None
            raise _WorkerDied(status, fresh=served == 0, sent=sent) from None
        finally:
            if worker is not None:
                self._idle.put(worker)
        if status == "error":
            raise value
        result: T = value  # fn(*args), as the worker returned it
        return result

    def warm_up(self) -> list[dict[str, Any]]:
        """Starts every worker not yet started and waits until each has warmed up; what each reported."""
        started = []
        while True:
            with self._lock:  # one slot reserved at a time, so a failed start holds none
                if self._closed or len(self._all) + self._starting >= self.workers:
                    break
                self._starting += 1
            started.append(self._spawn())
        for worker in started:
            self._idle.put(worker)
        with self._lock:
            workers = list(self._all)
        for worker in workers:
            try:
                worker.wait_ready()
            except (OSError, EOFError):  # it died starting: the first call that takes it replaces it
                continue
        return [worker.warm_up for worker in workers]

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._all]

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(len(self._all), self._peak, self.workers, self._started, self._restarts)

    def close(self) -> None:
        """Stops every worker (they exit quietly) and removes the shared folder; idempotent."""
        atexit.unregister(self.close)
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        self._idle.put(None)  # wakes a call waiting for a worker
        for worker in workers:
            try:
                worker.kill()
            except subprocess.TimeoutExpired:  # stuck in the kernel: left to the OS
                pass
        if self.shared_folder is not None:
            shutil.rmtree(self.shared_folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _shared_folder() -> Path | None:
    """A private folder in /dev/shm for workers' decoded tensors, or None where there is none."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"lazymedia-{os.getpid()}-", dir="/dev/shm"))
    except OSError:
        return None
    for stale in folder.parent.glob("lazymedia-*-*"):  # left by a killed server (no atexit ran)
        owner = stale.name.split("-")[1]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(stale, ignore_errors=True)
    atexit.register(shutil.rmtree, folder, True)  # a pool never closed (the process-wide one)
    return folder


def configured_workers() -> int:
    """The process-wide pool's size: LAZYMEDIA_ISOLATION_WORKERS, else DEFAULT_WORKERS (at most
    the cores this process may use). A serving box sizes it by its video/audio load, not its cores."""
    configured = os.environ.get(WORKERS_VARIABLE, "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(f"{WORKERS_VARIABLE} must be a whole number >= 1, got {configured!r}")
        return int(configured)
    return min(DEFAULT_WORKERS, len(os.sched_getaffinity(0)))


@process_wide
def default_pool() -> IsolatedPool:
    """The process-wide pool that engines isolating a modality use, built at the first isolated item."""
    return IsolatedPool(workers=configured_workers())


def decode_encoded(modality: str, data: bytes, header: Header, spec: Spec, limits: Limits) -> Decoded:
    """What a worker runs: the codec's decode of one item's bytes (module-level, so it pickles)."""
    from ..codecs import decode

    decoded: Decoded = decode(modality, data, header, spec, None, limits)
    return decoded


def copy_into(result: Decoded, out: torch.Tensor) -> Decoded:
    """Moves a decode made in a worker into the caller's buffer `out`: a result's tensor into the
    part of `out` it fills (fewer frames or samples than `out` holds, as a decode into `out` leaves)."""
    if not isinstance(result, TensorResult):
        out.copy_(result)
        return out
    view = out[tuple(slice(size) for size in result.tensor.shape)]
    view.copy_(result.tensor)
    return result.with_tensor(view)


if __name__ == "__main__":
    _worker_main(Connection(int(sys.argv[1])), Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None)
