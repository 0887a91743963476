"""Decoding in child processes, for untrusted input: a decoder that crashes (a segfault in
FFmpeg on a hostile file) or hangs kills only its child, which is replaced, and the caller gets
a typed error.

Workers are fresh interpreters (`python -m lazymedia.engine.isolation`) talking over a socket
pair: no fork of a threaded server, and no re-import of the server's __main__ as
multiprocessing's spawn and forkserver would do.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..errors import MediaError, UnprocessableMediaError
from ..singletons import process_wide

_READY = b"ready"
# A worker imports torch and the decoders before it can serve: minutes would mean it is stuck.
_STARTUP_TIMEOUT_S = 120.0


def _worker_main(conn) -> None:
    """Runs (fn, args) requests until the pipe closes; replies ("ok", value) or ("error", exc).
    Plain pickle both ways: tensors travel by value, with no shared-memory handles to leak."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    conn.send_bytes(_READY)
    while True:
        try:
            fn, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", fn(*args))
        except BaseException as exc:  # everything goes back to the parent, typed there
            reply = ("error", exc if isinstance(exc, MediaError) else
                     UnprocessableMediaError(f"decoder failed: {type(exc).__name__}: {exc}"))
        try:
            conn.send_bytes(pickle.dumps(reply))
        except (OSError, ValueError, pickle.PicklingError):
            return


class _Worker:
    def __init__(self):
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, "-m", "lazymedia.engine.isolation", str(child.fileno())],
                                        pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())
        self.ready = False

    def wait_ready(self) -> None:
        """Waits out the interpreter start, which the decode time-out must not include."""
        if not self.ready:
            if not self.conn.poll(_STARTUP_TIMEOUT_S) or self.conn.recv_bytes() != _READY:
                raise OSError("decoder process did not start")
            self.ready = True

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)
        self.conn.close()


class IsolatedPool:
    """`workers` decoder processes; `run(fn, *args, timeout_s=...)` executes fn(*args) in one of
    them. fn and its arguments must pickle (module-level functions, bytes, dataclasses)."""

    def __init__(self, workers: int = 2, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(workers):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        worker = _Worker()
        with self._lock:
            self._all.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.remove(worker)
            closed = self._closed
        if not closed:
            self._idle.put(self._spawn())

    def run(self, fn: Callable, *args, timeout_s: float | None = None) -> Any:
        if self._closed:
            raise RuntimeError("IsolatedPool is closed")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        worker: _Worker | None = self._idle.get()
        try:
            assert worker is not None
            worker.wait_ready()
            worker.conn.send_bytes(pickle.dumps((fn, args)))
            if not worker.conn.poll(timeout):
                self._replace(worker)
                worker = None
                raise UnprocessableMediaError(f"decoder timed out after {timeout:.0f} s", status_code=422)
            status, value = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            code = None
            if worker is not None:
                try:
                    code = worker.process.wait(1)
                except subprocess.TimeoutExpired:
                    pass
                self._replace(worker)
                worker = None
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise UnprocessableMediaError(f"decoder process died ({how})") from None
        finally:
            if worker is not None:
                self._idle.put(worker)
        if status == "error":
            raise value
        return value

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._all]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.kill()


@process_wide
def default_pool() -> IsolatedPool:
    """The process-wide pool that engines isolating a modality use (one worker per core)."""
    return IsolatedPool(workers=max(1, len(os.sched_getaffinity(0))))


def decode_encoded(modality: str, data: bytes, header, spec, limits):
    """What a worker runs: the codec's decode of one item's bytes (module-level, so it pickles)."""
    from ..codecs import codec

    return codec(modality).decode(data, header, spec, None, limits)


def copy_into(result, out):
    """Moves a decode made in a worker into the caller's buffer `out`."""
    for field in ("frames", "samples"):  # VideoFrames / AudioSamples
        tensor = getattr(result, field, None)
        if tensor is not None:
            view = out[: tensor.shape[0]] if field == "frames" else out
            view.copy_(tensor)
            setattr(result, field, view)
            return result
    out.copy_(result)
    return out


if __name__ == "__main__":
    _worker_main(Connection(int(sys.argv[1])))
