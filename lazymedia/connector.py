"""MediaConnector: fetch media from http(s), data: and file: URLs into undecoded LazyMedia.

Downloads stream through aiohttp (one connection pool per connector and event loop): the key is
hashed chunk by chunk as the body arrives, and the download stops as soon as it passes
`max_bytes`. Every hop of a redirect chain is checked against the domain allow-list and the
SSRF guard, and the guard also filters the addresses the resolver hands to the connection, so a
name that re-resolves to a private address between check and connect is still refused.
"""
from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import socket
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from .errors import InvalidMediaError, MediaError, MediaFetchError, MediaTooLargeError
from .hashing import KeyHasher, media_key
from .media import LazyMedia, from_base64, load
from .spec import DEFAULT_LIMITS, Limits, make_spec

_REDIRECTS = (301, 302, 303, 307, 308)


def _network_list(networks) -> list:
    return [ipaddress.ip_network(n, strict=False) for n in networks]


class _AddressGuard:
    """Refuses every address that is not globally routable (loopback, private, link-local and so
    cloud metadata at 169.254.169.254, CGNAT, multicast, reserved) unless allowed explicitly."""

    def __init__(self, allow_private_networks: bool | Iterable[str]):
        self.allow_all = allow_private_networks is True
        self.allowed = [] if isinstance(allow_private_networks, bool) else _network_list(allow_private_networks)

    def permits(self, address: str) -> bool:
        if self.allow_all:
            return True
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in network for network in self.allowed):
            return True
        return ip.is_global and not ip.is_multicast

    def check(self, address: str, url: str) -> None:
        if not self.permits(address):
            raise InvalidMediaError(f"refused {url}: {address} is not a public address")


class _RefusedAddress(OSError):
    """Raised by the resolver when a name resolves only to addresses the guard refuses."""


class _GuardedResolver(AbstractResolver):
    """Resolves names and drops refused addresses, so the connection can only reach checked ones."""

    def __init__(self, guard: _AddressGuard):
        self._guard = guard
        self._resolver = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        results = await self._resolver.resolve(host, port, family)
        allowed = [r for r in results if self._guard.permits(r["host"])]
        if not allowed:
            raise _RefusedAddress(f"{host} resolves only to non-public addresses")
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


class MediaConnector:
    """Fetches media URLs into LazyMedia without decoding them.

    allowed_domains: hostnames (and their subdomains) that http(s) URLs may name, on every hop;
    None allows any. allowed_local_path: directory file: URLs may read below; None refuses file:
    URLs. max_bytes: download limit (also the limit passed to the loaders). timeout_s: for the
    whole fetch of one URL. allow_redirects / max_redirects: redirect policy.
    allow_private_networks: True, or a list of networks (CIDR strings) exempt from the SSRF guard.
    download_cache_dir: keep http(s) bodies on disk keyed by URL and serve repeats from there
    (off by default; only for URLs whose content never changes).

    Use it as `async with MediaConnector(...) as connector:` (or call `aclose()`), so the
    connection pool of the event loop is closed; `close()` stops the sync methods' loop thread.
    """

    def __init__(self, allowed_domains: Iterable[str] | None = None,
                 allowed_local_path: str | os.PathLike | None = None, max_bytes: int = DEFAULT_LIMITS.max_bytes,
                 timeout_s: float = 10.0, allow_redirects: bool = True, max_redirects: int = 5,
                 allow_private_networks: bool | Iterable[str] = False, limits: Limits | None = None,
                 max_connections: int = 256, download_cache_dir: str | os.PathLike | None = None):
        self.allowed_domains = None if allowed_domains is None else [d.lower().strip(".") for d in allowed_domains]
        self.allowed_local_path = None if allowed_local_path is None else Path(allowed_local_path).resolve()
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.allow_redirects = allow_redirects
        self.max_redirects = max_redirects
        self.limits = dataclasses.replace(limits or DEFAULT_LIMITS, max_bytes=max_bytes)
        self.max_connections = max_connections
        self._guard = _AddressGuard(allow_private_networks)
        self.download_cache_dir = None if download_cache_dir is None else Path(download_cache_dir)
        if self.download_cache_dir is not None:
            self.download_cache_dir.mkdir(parents=True, exist_ok=True)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._loop_thread: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self._lock = threading.Lock()

    # -- public -----------------------------------------------------------------------------
    async def fetch(self, modality: str, url: str, **spec) -> LazyMedia:
        """An undecoded handle for `url` as `modality` ("image", "video", "audio") under the spec
        settings of load_image / load_video / load_audio; every failure is a MediaError with a
        status code."""
        spec_bytes = make_spec(modality, spec).canonical()
        scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
        try:
            if scheme in ("http", "https"):
                data, key = await self._fetch_http(url, modality, spec_bytes)
            elif scheme == "data":
                data = from_base64(url, self.limits)
                key = media_key(modality, spec_bytes, data)
            elif scheme == "file":
                data = await asyncio.to_thread(self._read_file_url, url)
                key = media_key(modality, spec_bytes, data)
            else:
                raise InvalidMediaError(f"unsupported URL scheme {scheme or url!r}: use http(s), data: or file:")
        except MediaError as exc:
            exc.modality = exc.modality or modality
            raise
        return load(modality, data, limits=self.limits, key=key, **spec)

    async def fetch_all(self, requests: Iterable[tuple[str, str, dict]]) -> list[LazyMedia]:
        """Fetches a request's items concurrently: (modality, url, spec settings) each. The first
        failing item (by position) is raised with `.index` set to its position, after every
        fetch has finished."""
        requests = list(requests)
        outcomes = await asyncio.gather(*(self.fetch(modality, url, **spec) for modality, url, spec in requests),
                                        return_exceptions=True)
        items = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, MediaError):
                raise outcome.with_index(index) from None
            if isinstance(outcome, BaseException):
                raise outcome
            items.append(outcome)
        return items

    def fetch_sync(self, modality: str, url: str, **spec) -> LazyMedia:
        """`fetch` for code without an event loop (runs on the connector's own loop thread)."""
        return self._run_sync(self.fetch(modality, url, **spec))

    async def aclose(self) -> None:
        """Closes the connection pool of the calling event loop."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    def close(self) -> None:
        """Closes the pool the sync methods use and stops their loop thread."""
        with self._lock:
            loop_thread, self._loop_thread = self._loop_thread, None
        if loop_thread is not None:
            loop, thread = loop_thread
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()

    # -- http(s) ----------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for gone in [other for other in self._sessions if other.is_closed()]:
                del self._sessions[gone]  # pools of closed loops: nothing can use (or close) them
            connector = aiohttp.TCPConnector(limit=self.max_connections, resolver=_GuardedResolver(self._guard))
            session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                            timeout=aiohttp.ClientTimeout(total=None))
            self._sessions[loop] = session
        return session

    def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https"):
            raise InvalidMediaError(f"refused redirect to non-http URL {url!r}")
        host = (parts.hostname or "").lower().strip(".")
        if not host:
            raise InvalidMediaError(f"URL has no host: {url!r}")
        if self.allowed_domains is not None and not any(host == d or host.endswith("." + d)
                                                        for d in self.allowed_domains):
            raise InvalidMediaError(f"refused {url}: {host} is not an allowed domain")
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return  # a name: the guarded resolver checks what it resolves to
        self._guard.check(host.strip("[]"), url)

    async def _fetch_http(self, url: str, modality: str, spec_bytes: bytes) -> tuple[bytes, str]:
        cached = self._cache_path(url)
        if cached is not None and cached.is_file():
            data = await asyncio.to_thread(cached.read_bytes)
            if len(data) <= self.max_bytes:
                return data, media_key(modality, spec_bytes, data)
        try:
            async with asyncio.timeout(self.timeout_s):
                data, key = await self._follow(url, modality, spec_bytes)
        except TimeoutError:
            raise MediaFetchError(f"timed out after {self.timeout_s} s fetching {url}", status_code=504) from None
        if cached is not None:
            await asyncio.to_thread(_write_atomically, cached, data)
        return data, key

    def _cache_path(self, url: str) -> Path | None:
        if self.download_cache_dir is None:
            return None
        return self.download_cache_dir / (media_key("url", b"", url.encode()) + ".bin")

    async def _follow(self, url: str, modality: str, spec_bytes: bytes) -> tuple[bytes, str]:
        for _ in range(self.max_redirects + 1):
            self._check_url(url)
            try:
                async with self._session().get(url, allow_redirects=False) as response:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not self.allow_redirects or not location:
                            raise MediaFetchError(f"{url} redirects ({response.status}) and redirects are off",
                                                  status_code=400)
                        url = urljoin(url, location)
                        continue
                    if response.status != 200:
                        raise MediaFetchError(f"{url} answered HTTP {response.status}", status_code=502)
                    return await self._read_body(response, url, modality, spec_bytes)
            except MediaError:
                raise
            except (aiohttp.ClientError, OSError) as exc:
                refused = exc if isinstance(exc, _RefusedAddress) else getattr(exc, "os_error", None)
                if isinstance(refused, _RefusedAddress) or isinstance(exc.__cause__, _RefusedAddress):
                    raise InvalidMediaError(f"refused {url}: {refused or exc.__cause__}") from None
                raise MediaFetchError(f"fetching {url} failed: {type(exc).__name__}: {exc}", status_code=502) from None
        raise MediaFetchError(f"more than {self.max_redirects} redirects fetching {url}", status_code=400)

    async def _read_body(self, response, url: str, modality: str, spec_bytes: bytes) -> tuple[bytes, str]:
        declared = response.content_length
        if declared is not None and declared > self.max_bytes:
            raise MediaTooLargeError(f"{url} declares {declared} bytes, over the {self.max_bytes} byte limit")
        hasher = KeyHasher(modality, spec_bytes)
        chunks = []
        async for chunk in response.content.iter_any():
            if hasher.nbytes + len(chunk) > self.max_bytes:
                raise MediaTooLargeError(f"{url} sent more than the {self.max_bytes} byte limit")
            hasher.update(chunk)
            chunks.append(chunk)
        return b"".join(chunks), hasher.hexdigest()  # a one-chunk body is not copied

    # -- file: ------------------------------------------------------------------------------
    def _read_file_url(self, url: str) -> bytes:
        if self.allowed_local_path is None:
            raise InvalidMediaError("file: URLs are refused (no allowed_local_path)")
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise InvalidMediaError(f"file: URL names a remote host: {url!r}")
        path = Path(unquote(parts.path)).resolve()
        root = self.allowed_local_path
        if path != root and root not in path.parents:
            raise InvalidMediaError(f"refused {url}: outside the allowed local path")
        try:
            # O_NOFOLLOW: a symlink swapped in after resolve() fails; O_NONBLOCK: a FIFO cannot hang us.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise InvalidMediaError(f"cannot open {url}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidMediaError(f"refused {url}: not a regular file")
            if info.st_size > self.max_bytes:
                raise MediaTooLargeError(f"{url}: {info.st_size} bytes exceed the {self.max_bytes} byte limit")
            with os.fdopen(fd, "rb") as f:
                fd = -1  # owned by f now
                data = f.read(self.max_bytes + 1)
        finally:
            if fd >= 0:
                os.close(fd)
        if len(data) > self.max_bytes:
            raise MediaTooLargeError(f"{url} grew past the {self.max_bytes} byte limit while read")
        return data

    # -- sync twins ---------------------------------------------------------------------------
    def _run_sync(self, coroutine):
        with self._lock:
            if self._loop_thread is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="lazymedia-connector", daemon=True)
                thread.start()
                self._loop_thread = (loop, thread)
            loop = self._loop_thread[0]
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
