"""MediaConnector: fetch media from http(s), data: and file: URLs into undecoded LazyMedia.

Downloads stream through aiohttp (one connection pool per connector and live event loop): the key
is hashed chunk by chunk as the body arrives, and the download stops as soon as it passes
`max_bytes`. Every hop of a redirect chain is read by the client's own URL parser (yarl) and that
one reading is what the domain allow-list and the SSRF guard (lazymedia.guard) judge and what the
client requests. The guard also filters the addresses the resolver returns, and it checks the
address of every socket the client opens (IP literals skip the resolver), so no spelling of a
host and no re-resolution reaches a refused address. data: payloads are size-checked before any
copy and decoded off the event loop; file: URLs open component by component beneath the allowed
root.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import os
import socket
import threading
import time
import zlib
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.connector import AddrInfoType, SocketFactoryType
from aiohttp.resolver import DefaultResolver
from yarl import URL

from .errors import (
    InvalidMediaError,
    MediaError,
    MediaFetchError,
    MediaTooLargeError,
    described,
    upstream_status_error,
)
from .guard import (
    AddressGuard,
    DataTarget,
    FileTarget,
    HttpTarget,
    Target,
    canonical_ip,
    read_beneath,
    read_http_url,
    read_target,
)
from .hashing import KeyHasher, media_key
from .media import LazyMedia, from_base64, load, probe_is_instant
from .metrics import count, observe
from .spec import DEFAULT_LIMITS, Limits, make_spec

_REDIRECTS = (301, 302, 303, 307, 308)
# The client asks for bodies as they are (media is compressed already). A server that compresses
# anyway (gzip or deflate) is inflated within max_bytes, counted on the inflated bytes, and within
# INFLATE_RATIO times the compressed bytes received plus INFLATE_FREE_BYTES: a compression bomb
# is refused after its first chunk, not after max_bytes of zeros.
INFLATE_RATIO = 64
INFLATE_FREE_BYTES = 1 << 20
_INFLATE_STEP = 1 << 20  # inflated bytes per step, so no single step outgrows the limits
_Result = TypeVar("_Result")


class _RefusedAddress(OSError):
    """Raised by the resolver when a name resolves only to addresses the guard refuses, and by
    the socket factory for a refused address."""


# The addresses the socket factory refused during the current fetch (a list per fetch): aiohttp
# may fold a refusal into a generic OSError when it tried several addresses.
_REFUSED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("lazymedia_refused", default=None)


def _guarded_socket_factory(guard: AddressGuard) -> SocketFactoryType:
    """aiohttp's socket factory: every connection the client opens, for a name or an IP literal
    and on every redirect hop, first has its final address checked here."""

    def open_socket(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        if not guard.permits(str(sockaddr[0])):
            refused = _REFUSED.get()
            if refused is not None:
                refused.append(str(sockaddr[0]))
            raise _RefusedAddress(f"{sockaddr[0]} is not a public address")
        return socket.socket(family=family, type=type_, proto=proto)

    return open_socket


class _GuardedResolver(AbstractResolver):
    """Resolves names and drops refused addresses, so the connection can only reach checked ones."""

    def __init__(self, guard: AddressGuard):
        self._guard = guard
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        allowed = [r for r in results if self._guard.permits(r["host"])]
        if not allowed:
            raise _RefusedAddress(f"{host} resolves only to non-public addresses")
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


def _ascii_domain(domain: str) -> str:
    """An allow-list entry in the form the client connects with (IDNA, lower case, no end dot)."""
    return (URL.build(scheme="http", host=domain.strip(".")).raw_host or "").lower()


class _Inflater:
    """Inflates a gzip or deflate body chunk by chunk, refusing (413) a body that inflates past
    `max_bytes` or past INFLATE_RATIO x the compressed bytes inflated so far (+ INFLATE_FREE_BYTES),
    checked step by step, so a bomb costs about INFLATE_FREE_BYTES whatever its chunks' size."""

    def __init__(self, encoding: str, max_bytes: int):
        self.encoding = encoding
        self.max_bytes = max_bytes
        self.consumed = self.inflated = 0
        self._inflate = zlib.decompressobj(31 if encoding in ("gzip", "x-gzip") else 15)

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.consumed == 0 and self.encoding == "deflate" and chunk:
            # A zlib stream by the RFC; raw deflate in practice too (no zlib header).
            zlib_header = len(chunk) >= 2 and chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0
            if not zlib_header:
                self._inflate = zlib.decompressobj(-15)
        out = []
        pending = chunk
        while True:
            allowed = min(self.max_bytes, INFLATE_RATIO * self.consumed + INFLATE_FREE_BYTES) - self.inflated
            step = min(allowed + 1, _INFLATE_STEP)
            try:
                piece = self._inflate.decompress(pending, step)
            except zlib.error as exc:
                raise InvalidMediaError(
                    f"the {self.encoding} body does not inflate ({exc}): send the file as it is"
                ) from None
            if self._inflate.unused_data:
                raise InvalidMediaError(f"the {self.encoding} body has data after its end: send the file as it is")
            self.inflated += len(piece)
            if self.inflated > self.max_bytes:
                raise MediaTooLargeError(
                    f"the response inflates to more than the {self.max_bytes}-byte limit: send a smaller file",
                    hint="raise MediaConnector(max_bytes=)",
                    limit="max_bytes",
                    maximum=self.max_bytes,
                    value=self.inflated,
                )
            if len(piece) > allowed:
                # Not a size the client could lower: no media format compresses this far (400, as a
                # bomb was before the client inflated).
                raise InvalidMediaError(
                    f"the {self.encoding} body inflates more than {INFLATE_RATIO}:1, which "
                    "media does not: a compression bomb"
                )
            out.append(piece)
            self.consumed += len(pending) - len(self._inflate.unconsumed_tail)
            pending = self._inflate.unconsumed_tail
            if not pending and len(piece) < step:  # a full step may leave output inside zlib
                return out

    def finish(self) -> None:
        if not self._inflate.eof:
            raise InvalidMediaError(f"the {self.encoding} body is truncated: retry, or send the file as it is")


def _finish(hasher: KeyHasher | None, data: bytes) -> str | None:
    if hasher is None:
        return None
    hasher.update(data)
    return hasher.hexdigest()


class MediaConnector:
    """Fetches media URLs into LazyMedia without decoding them.

    allowed_domains: hostnames (and their subdomains, unless allow_subdomains=False) that http(s)
    URLs may name, on every hop; None allows any. allowed_local_path: directory file: URLs may
    read below (symlinks are not followed); None refuses file: URLs. max_bytes: download limit
    (also the limit passed to the loaders). timeout_s: for the whole fetch of one URL.
    allow_redirects / max_redirects: redirect policy. allow_private_networks: True, or a list of
    networks (CIDR strings) exempt from the SSRF guard. download_cache_dir: keep http(s) bodies
    on disk keyed by URL and serve repeats from there once the URL passes the same checks as a
    fresh fetch (off by default; only for URLs whose content never changes).

    Use it as `async with MediaConnector(...) as connector:` (or call `aclose()`), so the
    connection pool of the event loop is closed; `close()` stops the sync methods' loop thread.
    """

    def __init__(
        self,
        allowed_domains: Iterable[str] | None = None,
        allowed_local_path: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_LIMITS.max_bytes,
        timeout_s: float = 10.0,
        allow_redirects: bool = True,
        max_redirects: int = 5,
        allow_private_networks: bool | Iterable[str] = False,
        limits: Limits | None = None,
        max_connections: int = 256,
        download_cache_dir: str | os.PathLike[str] | None = None,
        allow_subdomains: bool = True,
    ):
        self.allowed_domains = None if allowed_domains is None else [_ascii_domain(d) for d in allowed_domains]
        self.allow_subdomains = allow_subdomains
        self.allowed_local_path = None if allowed_local_path is None else Path(allowed_local_path).resolve()
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.allow_redirects = allow_redirects
        self.max_redirects = max_redirects
        self.limits = dataclasses.replace(limits or DEFAULT_LIMITS, max_bytes=max_bytes)
        self.max_connections = max_connections
        self.guard = AddressGuard(allow_private_networks)
        self.download_cache_dir = None if download_cache_dir is None else Path(download_cache_dir)
        if self.download_cache_dir is not None:
            self.download_cache_dir.mkdir(parents=True, exist_ok=True)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._loop_thread: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self._lock = threading.Lock()

    # -- public -----------------------------------------------------------------------------
    async def fetch(
        self,
        modality: str,
        url: str | Target,
        *,
        timeout_s: float | None = None,
        limits: Limits | None = None,
        **spec: Any,
    ) -> LazyMedia[Any]:
        """An undecoded handle for `url` as `modality` ("image", "video", "audio") under the spec
        settings of load_image / load_video / load_audio; every failure is a MediaError with a
        status code. Container probes (video, audio) run off the event loop. `url` may be a
        target a caller already read with guard.read_target (so one URL is read once);
        `timeout_s` and `limits` replace the connector's for this fetch, the download's byte cap
        (`limits.max_bytes`) included."""
        spec_bytes = make_spec(modality, spec).canonical()
        limits = limits or self.limits
        started = time.perf_counter()
        try:
            data, key = await self._read(url, KeyHasher(modality, spec_bytes), timeout_s, limits.max_bytes)
        except MediaError as exc:
            exc.modality = exc.modality or modality
            count("item_errors", stage="fetch", modality=modality, status=str(exc.status_code))
            raise
        finally:  # timed by hand: an NVTX range cannot span an await
            observe("fetch", time.perf_counter() - started, modality=modality)
        if probe_is_instant(modality, data):  # Pillow's parse goes to a thread
            return load(modality, data, limits=limits, key=key, **spec)
        return await asyncio.to_thread(load, modality, data, limits=limits, key=key, **spec)

    async def download(self, url: str) -> bytes:
        """The bytes `url` names, under every check and limit of `fetch`, for a caller that
        decides the modality afterwards (the CLI guesses it from the bytes)."""
        data, _ = await self._read(url, None)
        return data

    async def fetch_all(self, requests: Iterable[tuple[str, str, dict[str, Any]]]) -> list[LazyMedia[Any]]:
        """Fetches a request's items concurrently: (modality, url, spec settings) each. The first
        failing item (by position) is raised with `.index` set to its position, after every
        fetch has finished."""
        requests = list(requests)
        outcomes = await asyncio.gather(
            *(self.fetch(modality, url, **spec) for modality, url, spec in requests), return_exceptions=True
        )
        items = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, MediaError):
                raise outcome.with_index(index) from None
            if isinstance(outcome, BaseException):
                raise outcome
            items.append(outcome)
        return items

    def fetch_sync(
        self,
        modality: str,
        url: str | Target,
        *,
        timeout_s: float | None = None,
        limits: Limits | None = None,
        **spec: Any,
    ) -> LazyMedia[Any]:
        """`fetch` for code without an event loop (runs on the connector's own loop thread)."""
        return self._submit(self.fetch(modality, url, timeout_s=timeout_s, limits=limits, **spec)).result()

    async def fetch_on_own_loop(
        self,
        modality: str,
        url: str | Target,
        *,
        timeout_s: float | None = None,
        limits: Limits | None = None,
        **spec: Any,
    ) -> LazyMedia[Any]:
        """`fetch` run on the connector's own loop thread, awaited from any event loop: the
        connection pool then lives, and is closed, with the connector (`close()`), not with the
        caller's loop, which a server may close first and leave the pool open ("Unclosed client
        session"). Cancelling the caller cancels the fetch."""
        future = self._submit(self.fetch(modality, url, timeout_s=timeout_s, limits=limits, **spec))
        return await asyncio.wrap_future(future)

    def download_sync(self, url: str) -> bytes:
        """`download` for code without an event loop."""
        return self._submit(self.download(url)).result()

    async def aclose(self) -> None:
        """Closes the connection pool of the calling event loop."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    def close(self) -> None:
        """Closes the pool the sync methods use, stops their loop thread, and forgets the pools
        of event loops that have closed."""
        self._drop_closed_loops()
        with self._lock:
            loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is not None:
            loop, thread = loop_thread
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    async def __aenter__(self) -> MediaConnector:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def open_pools(self) -> int:
        """Connection pools held (one per live event loop that fetched)."""
        return len(self._sessions)

    async def _read(
        self, url: str | Target, hasher: KeyHasher | None, timeout_s: float | None = None, max_bytes: int | None = None
    ) -> tuple[bytes, str | None]:
        """(bytes, key) for any supported URL, at most `max_bytes` (the connector's by default);
        the key only when a hasher is given."""
        max_bytes = self.max_bytes if max_bytes is None else max_bytes
        match read_target(url):
            case HttpTarget(url=parsed):
                return await self._fetch_http(parsed, hasher, timeout_s, max_bytes)
            case DataTarget(text=text):
                if len(text) // 4 * 3 > 2 * max_bytes + 3:  # before any copy of a huge payload
                    raise MediaTooLargeError(
                        f"a data: URL of {len(text)} characters is over the {max_bytes}-byte "
                        "limit: send a smaller file",
                        hint="raise MediaConnector(max_bytes=)",
                        limit="max_bytes",
                        maximum=max_bytes,
                        value=len(text) // 4 * 3,
                    )
                return await asyncio.to_thread(self._read_data_url, text, hasher, max_bytes)
            case FileTarget() as file:
                return await asyncio.to_thread(self._read_file_url, file, hasher, max_bytes)

    # -- http(s) ----------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            self._drop_closed_loops()
            connector = aiohttp.TCPConnector(
                limit=self.max_connections,
                resolver=_GuardedResolver(self.guard),
                socket_factory=_guarded_socket_factory(self.guard),
            )
            session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
                headers={"Accept-Encoding": "identity"},
            )
            self._sessions[loop] = session
        return session

    def _drop_closed_loops(self) -> None:
        """Forgets the pools of event loops that have closed: nothing can use or close them."""
        for gone in [loop for loop in self._sessions if loop.is_closed()]:
            self._sessions.pop(gone).detach()

    def _check_url(self, url: URL) -> str:
        """Checks one hop as the client reads it (scheme, domain allow-list, literal addresses);
        returns its host."""
        if url.scheme not in ("http", "https"):
            raise InvalidMediaError("refused a redirect to a non-http(s) URL: send the final http(s) URL")
        host = (url.raw_host or "").lower().strip(".")
        if not host:
            raise InvalidMediaError("URL has no host: send an absolute http(s) URL")
        if self.allowed_domains is not None and not any(
            host == d or self.allow_subdomains and host.endswith("." + d) for d in self.allowed_domains
        ):
            raise InvalidMediaError(
                f"refused {host}: not an allowed domain",
                hint="MediaConnector(allowed_domains=) lists the domains admitted",
            )
        ip = canonical_ip(host)
        if ip is not None:
            self.guard.check(ip, host)
        return host

    async def _fetch_http(
        self, url: URL, hasher: KeyHasher | None, timeout_s: float | None, max_bytes: int
    ) -> tuple[bytes, str | None]:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        cached = self._cache_path(str(url))
        if cached is not None and cached.is_file():
            host = self._check_url(url)  # the checks of a fresh fetch, before serving it
            if canonical_ip(host) is None:
                await self._check_resolves(host)
            data = await asyncio.to_thread(cached.read_bytes)
            if len(data) <= max_bytes:
                return data, _finish(hasher, data)
        try:
            async with asyncio.timeout(timeout_s):
                data, key = await self._follow(url, hasher, max_bytes)
        except TimeoutError:
            raise MediaFetchError(
                f"fetching the URL timed out after {timeout_s:g} s: retry, or send a URL that answers sooner",
                hint="raise MediaConnector(timeout_s=)",
                status_code=504,
            ) from None
        if cached is not None:
            await asyncio.to_thread(_write_atomically, cached, data)
        return data, key

    async def _check_resolves(self, host: str) -> None:
        """Refuses a name that resolves only to addresses the guard refuses."""
        try:
            async with asyncio.timeout(self.timeout_s):
                results = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise MediaFetchError(
                f"cannot resolve {host} ({getattr(exc, 'strerror', None) or exc}): check the host name", status_code=502
            ) from None
        if not any(self.guard.permits(str(result[4][0])) for result in results):
            raise InvalidMediaError(
                f"refused {host}: it resolves only to non-public addresses",
                hint="MediaConnector(allow_private_networks=) admits private networks",
            )

    def _cache_path(self, url: str) -> Path | None:
        if self.download_cache_dir is None:
            return None
        return self.download_cache_dir / (media_key("url", b"", url.encode()) + ".bin")

    async def _follow(self, url: URL, hasher: KeyHasher | None, max_bytes: int) -> tuple[bytes, str | None]:
        refused: list[str] = []
        token = _REFUSED.set(refused)
        try:
            return await self._follow_hops(url, hasher, refused, max_bytes)
        finally:
            _REFUSED.reset(token)

    async def _follow_hops(
        self, url: URL, hasher: KeyHasher | None, refused: list[str], max_bytes: int
    ) -> tuple[bytes, str | None]:
        for _ in range(self.max_redirects + 1):
            host = self._check_url(url)
            try:
                async with self._session().get(url, allow_redirects=False) as response:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not self.allow_redirects or not location:  # the server's policy, not the upstream's
                            raise InvalidMediaError(
                                f"{host} redirects ({response.status}): send the final URL",
                                hint="MediaConnector(allow_redirects=True) follows redirects",
                            )
                        url = read_http_url(location, base=url)
                        continue
                    if response.status != 200:
                        raise upstream_status_error(host, response.status, response.reason)
                    return await self._read_body(response, hasher, max_bytes)
            except MediaError:
                raise
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                if refused:
                    raise InvalidMediaError(
                        f"refused {host}: {refused[0]} is not a public address",
                        hint="MediaConnector(allow_private_networks=) admits private networks",
                    ) from None
                cause = exc if isinstance(exc, _RefusedAddress) else getattr(exc, "os_error", None)
                if isinstance(cause, _RefusedAddress) or isinstance(exc.__cause__, _RefusedAddress):
                    raise InvalidMediaError(
                        f"refused {cause or exc.__cause__}",
                        hint="MediaConnector(allow_private_networks=) admits private networks",
                    ) from None
                # The client learns what failed, not where: aiohttp's text names the address and port
                # the host resolved to, which stays in the operator's hint.
                errno = getattr(exc, "errno", None)
                reason = f"{type(exc).__name__}: {os.strerror(errno)}" if errno else type(exc).__name__
                raise MediaFetchError(
                    f"fetching from {host} failed ({reason}): retry later, or check that the host serves the URL",
                    hint=described(exc),
                    status_code=502,
                ) from None
        raise MediaFetchError(
            f"more than {self.max_redirects} redirects: send the final URL",
            hint="raise MediaConnector(max_redirects=)",
            status_code=400,
        )

    async def _read_body(
        self, response: aiohttp.ClientResponse, hasher: KeyHasher | None, max_bytes: int
    ) -> tuple[bytes, str | None]:
        declared = response.content_length
        if declared is not None and declared > max_bytes:
            raise MediaTooLargeError(
                f"the response declares {declared} bytes, over the {max_bytes}-byte limit: send a smaller file",
                hint="raise MediaConnector(max_bytes=)",
                limit="max_bytes",
                maximum=max_bytes,
                value=declared,
            )
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        inflater = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            inflater = _Inflater(encoding, max_bytes)
        elif encoding != "identity":
            raise MediaFetchError(
                f"upstream {response.url.host} sent Content-Encoding {encoding!r}, which the client "
                "did not ask for: serve the file as it is",
                status_code=502,
            )
        received = 0
        chunks = []
        async for chunk in response.content.iter_any():
            for piece in inflater.feed(chunk) if inflater is not None else (chunk,):
                received += len(piece)
                if received > max_bytes:
                    raise MediaTooLargeError(
                        f"the response sent more than the {max_bytes}-byte limit: send a smaller file",
                        hint="raise MediaConnector(max_bytes=)",
                        limit="max_bytes",
                        maximum=max_bytes,
                        value=received,
                    )
                if hasher is not None:
                    hasher.update(piece)
                chunks.append(piece)
        if inflater is not None:
            inflater.finish()
        return b"".join(chunks), None if hasher is None else hasher.hexdigest()  # one chunk is not copied

    # -- data: and file: (run in a worker thread) ---------------------------------------------
    def _read_data_url(self, url: str, hasher: KeyHasher | None, max_bytes: int) -> tuple[bytes, str | None]:
        data = from_base64(url, dataclasses.replace(self.limits, max_bytes=max_bytes))
        return data, _finish(hasher, data)

    def _read_file_url(self, file: FileTarget, hasher: KeyHasher | None, max_bytes: int) -> tuple[bytes, str | None]:
        if self.allowed_local_path is None:
            raise InvalidMediaError(
                "file: URLs are refused by this server",
                hint="MediaConnector(allowed_local_path=) admits file: URLs below a folder",
            )
        if file.host not in ("", "localhost"):
            raise InvalidMediaError("file: URL names a remote host: use file:///path, or http(s) for a remote file")
        path = file.path
        root = str(self.allowed_local_path)
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            raise InvalidMediaError(
                "refused a file: URL outside the folder this server reads",
                hint="MediaConnector(allowed_local_path=) names that folder",
            )
        data = read_beneath(root, path[len(root) :], max_bytes)
        return data, _finish(hasher, data)

    # -- sync twins ---------------------------------------------------------------------------
    def _submit(self, coroutine: Coroutine[Any, Any, _Result]) -> concurrent.futures.Future[_Result]:
        """Runs `coroutine` on the connector's loop thread (started on first use)."""
        with self._lock:
            if self._loop_thread is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="lazymedia-connector", daemon=True)
                thread.start()
                self._loop_thread = (loop, thread)
            loop = self._loop_thread[0]
        return asyncio.run_coroutine_threadsafe(coroutine, loop)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
