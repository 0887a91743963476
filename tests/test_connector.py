"""MediaConnector against a real aiohttp server on 127.0.0.1."""

import asyncio
import base64
import contextlib
import gzip
import os
import random
import tracemalloc
import zlib
from urllib.parse import quote

import pytest
from aiohttp import web

import lazymedia
from lazymedia import InvalidMediaError, MediaError, MediaFetchError, MediaTooLargeError
from lazymedia.connector import MediaConnector

from conftest import encode, make_image

LOCAL = ["127.0.0.1/32"]  # the tests' server; every other private address stays refused


@pytest.fixture(scope="module")
def image_bytes():
    return encode(make_image(96, 128), "JPEG", quality=90)


class Server:
    def __init__(self, image_bytes):
        self.image = image_bytes
        self.sent_bytes = 0
        self.in_flight = 0
        self.peak = 0
        self.gate = asyncio.Event()
        self.gate_size = 64
        self.requests = 0
        self.redirects = 0
        self.accept_encoding: list[str] = []

    def app(self):
        app = web.Application()
        r = app.router
        r.add_get("/img.jpg", self.img)
        r.add_get("/gated/{n}.jpg", self.gated)
        r.add_get("/slow.jpg", self.slow)
        r.add_get("/endless", self.endless)
        r.add_get("/liar_short", self.liar_short)
        r.add_get("/liar_long", self.liar_long)
        r.add_get("/big_declared", self.big_declared)
        r.add_get("/redirect", self.redirect)
        r.add_get("/raw_redirect", self.raw_redirect)
        r.add_get("/missing", self.missing)
        r.add_get("/encoded/{encoding}", self.encoded)
        r.add_get("/gzip_bomb", self.gzip_bomb)
        return app

    async def encoded(self, request):
        """?body=png|noise: the body, compressed as the path says ("gzip" only when the client
        accepts it, like a well-behaved server; "always-gzip", "deflate", "raw-deflate",
        "truncated-gzip", "br" whatever the client asked)."""
        self.accept_encoding.append(request.headers.get("Accept-Encoding", ""))
        body = self.png if request.query.get("body", "png") == "png" else self.noise
        encoding = request.match_info["encoding"]
        accepted = "gzip" in request.headers.get("Accept-Encoding", "")
        if encoding == "gzip" and not accepted:
            return web.Response(body=body, content_type="image/png")
        raw = zlib.compressobj(1, wbits=-15)
        packed = {
            "gzip": lambda: gzip.compress(body, 1),
            "always-gzip": lambda: gzip.compress(body, 1),
            "deflate": lambda: zlib.compress(body, 1),
            "raw-deflate": lambda: raw.compress(body) + raw.flush(),
            "truncated-gzip": lambda: gzip.compress(body, 1)[:-100],
            "br": lambda: body,
        }[encoding]()
        name = {"always-gzip": "gzip", "truncated-gzip": "gzip", "raw-deflate": "deflate"}.get(encoding, encoding)
        return web.Response(body=packed, content_type="image/png", headers={"Content-Encoding": name})

    async def gzip_bomb(self, request):
        """Up to 1 GiB of zeros as a chunked gzip stream (about 1 MB on the wire)."""
        response = web.StreamResponse(headers={"Content-Encoding": "gzip"})
        await response.prepare(request)
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        try:
            for _ in range(64):
                chunk = packer.compress(self.zeros) + packer.flush(zlib.Z_SYNC_FLUSH)
                self.sent_bytes += len(chunk)
                await response.write(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    async def missing(self, request):
        return web.Response(status=404)

    async def img(self, request):
        self.requests += 1
        return web.Response(body=self.image, content_type="image/jpeg")

    async def gated(self, request):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.gate_size:
            self.gate.set()
        await asyncio.wait_for(self.gate.wait(), 10)  # opens only once gate_size requests wait at once
        self.in_flight -= 1
        return web.Response(body=self.image)

    async def slow(self, request):
        await asyncio.sleep(5)
        return web.Response(body=self.image)

    async def endless(self, request):
        response = web.StreamResponse()  # chunked: no Content-Length
        await response.prepare(request)
        chunk = os.urandom(1 << 16)
        try:
            for _ in range(10_000):
                await response.write(chunk)
                self.sent_bytes += len(chunk)
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    async def liar_short(self, request):
        # Claims fewer bytes than the image has: the client must stop at Content-Length.
        return web.Response(body=self.image[:100], headers={"Content-Length": "100"})

    async def liar_long(self, request):
        # Claims more bytes than it sends, then closes the connection.
        response = web.StreamResponse(headers={"Content-Length": str(len(self.image) * 2)})
        await response.prepare(request)
        await response.write(self.image)
        request.transport.close()
        return response

    async def big_declared(self, request):
        response = web.StreamResponse(headers={"Content-Length": str(1 << 30)})
        await response.prepare(request)
        await response.write(b"\xff\xd8\xff" * 100)
        self.sent_bytes += 300
        return response

    async def redirect(self, request):
        raise web.HTTPFound(request.query["to"])

    async def raw_redirect(self, request):
        # The Location as given, not re-encoded (HTTPFound would write an IDNA host in ASCII).
        self.redirects += 1
        return web.Response(status=302, headers={"Location": request.query["to"]})


async def start(state: Server, host: str) -> tuple[web.AppRunner, int]:
    """Serves `state` on host (a free port); returns the runner to clean up and the port."""
    runner = web.AppRunner(state.app())
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    return runner, runner.addresses[0][1]


@pytest.fixture
async def server(image_bytes):
    state = Server(image_bytes)
    state.png = encode(make_image(96, 128), "PNG")
    # 2 MiB of four symbols: compresses about 4:1, so it is over a 1 MiB max_bytes only inflated
    state.noise = bytes(random.Random(0).choices(b"abcd", k=2 << 20))
    state.zeros = bytes(16 << 20)
    runner, port = await start(state, "127.0.0.1")
    state.url = f"http://127.0.0.1:{port}"
    state.port = port
    yield state
    await runner.cleanup()


@pytest.fixture
async def connector():
    c = MediaConnector(allow_private_networks=LOCAL, timeout_s=2.0, max_bytes=1 << 20)
    yield c
    await c.aclose()


async def test_fetch_is_lazy_and_key_matches_direct_load(server, connector, image_bytes):
    item = await connector.fetch("image", server.url + "/img.jpg")
    assert not item.is_decoded
    assert item.is_hashed  # hashed while downloading
    assert item.key == lazymedia.load_image(image_bytes).key
    resized = await connector.fetch("image", server.url + "/img.jpg", size=(10, 10))
    assert resized.key == lazymedia.load_image(image_bytes, size=(10, 10)).key
    assert item.media.shape == (96, 128, 3)


async def test_64_concurrent_fetches(server, connector):
    server.gate_size = 64
    items = await asyncio.gather(*[connector.fetch("image", f"{server.url}/gated/{i}.jpg") for i in range(64)])
    assert len(items) == 64 and server.peak >= 64
    assert len({item.key for item in items}) == 1


async def test_slow_server_times_out(server):
    # The server answers after 5 s: a 504 instead of the image proves the 0.3 s time-out fired.
    c = MediaConnector(allow_private_networks=LOCAL, timeout_s=0.3)
    with pytest.raises(MediaFetchError) as info:
        await c.fetch("image", server.url + "/slow.jpg")
    assert info.value.status_code == 504
    await c.aclose()


async def test_chunked_body_cut_off_at_max_bytes(server):
    c = MediaConnector(allow_private_networks=LOCAL, max_bytes=256 << 10, timeout_s=5)
    with pytest.raises(MediaTooLargeError) as info:
        await c.fetch("image", server.url + "/endless")
    assert info.value.status_code == 413
    await c.aclose()
    await asyncio.sleep(0.2)
    # the server could push only what the socket buffers hold past the limit, not the 640 MB body
    assert server.sent_bytes < 16 << 20


async def test_declared_length_over_limit_refused_before_reading(server, connector):
    with pytest.raises(MediaTooLargeError):
        await connector.fetch("image", server.url + "/big_declared")


async def test_the_client_asks_for_bodies_as_they_are(server, connector):
    # A server that compresses only for clients that accept it sends the PNG as it is.
    item = await connector.fetch("image", server.url + "/encoded/gzip")
    assert server.accept_encoding == ["identity"]
    assert item.key == lazymedia.load_image(server.png).key and item.media.shape == (96, 128, 3)


@pytest.mark.parametrize("encoding", ["always-gzip", "deflate", "raw-deflate"])
async def test_a_body_compressed_anyway_is_inflated(server, connector, encoding):
    item = await connector.fetch("image", f"{server.url}/encoded/{encoding}")
    assert item.key == lazymedia.load_image(server.png).key  # the key of the inflated bytes
    assert item.media.shape == (96, 128, 3)
    assert await connector.download(f"{server.url}/encoded/{encoding}") == server.png


async def test_compressed_bodies_that_are_not_media(server):
    connector = MediaConnector(allow_private_networks=LOCAL, timeout_s=60, max_bytes=1 << 20)
    # Inflated past max_bytes (1 MiB) from 4:1 data: 413, counted on the inflated bytes.
    with pytest.raises(MediaTooLargeError, match="inflates to more than the"):
        await connector.fetch("image", server.url + "/encoded/always-gzip?body=noise")
    with pytest.raises(InvalidMediaError, match="truncated") as info:
        await connector.fetch("image", server.url + "/encoded/truncated-gzip")
    assert info.value.status_code == 400
    with pytest.raises(MediaFetchError, match="'br'") as info:
        await connector.fetch("image", server.url + "/encoded/br")
    assert info.value.status_code == 502
    await connector.aclose()


async def test_a_gzip_bomb_is_refused_at_its_first_chunk(server):
    c = MediaConnector(allow_private_networks=LOCAL, timeout_s=30)  # max_bytes: the default 64 MiB
    tracemalloc.start()
    try:
        with pytest.raises(InvalidMediaError, match="compression bomb") as info:
            await c.fetch("image", server.url + "/gzip_bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    await c.aclose()
    assert info.value.status_code == 400
    assert peak < 4 << 20  # about 1 MiB inflated (INFLATE_FREE_BYTES), not 64 MiB of zeros
    assert server.sent_bytes < 1 << 20  # one or two of the 64 chunks


async def test_lying_content_length(server, connector):
    with pytest.raises(lazymedia.UnprocessableMediaError):  # 100 bytes of a JPEG: the header is cut
        item = await connector.fetch("image", server.url + "/liar_short")
        item.decode()
    with pytest.raises(MediaFetchError) as info:
        await connector.fetch("image", server.url + "/liar_long")
    assert info.value.status_code == 502


async def test_http_error_status(server, connector):
    with pytest.raises(MediaFetchError) as info:
        await connector.fetch("image", server.url + "/missing")
    assert info.value.status_code == 400 and "404" in str(info.value)  # the client's URL is wrong: no retry


async def test_redirect_to_disallowed_domain(server):
    c = MediaConnector(allow_private_networks=LOCAL, allowed_domains=["127.0.0.1"])
    assert (await c.fetch("image", f"{server.url}/redirect?to=/img.jpg")).header.width == 128
    with pytest.raises(InvalidMediaError, match="allowed domain"):
        await c.fetch("image", f"{server.url}/redirect?to=http://example.com/x.jpg")
    await c.aclose()


async def test_redirect_to_loopback_refused_by_guard(server, image_bytes):
    # A second server on 127.0.0.2: the guard, not a closed port, must stop the hop.
    other = Server(image_bytes)
    runner, port = await start(other, "127.0.0.2")
    c = MediaConnector(allow_private_networks=LOCAL)
    try:
        for target in (f"http://127.0.0.2:{port}/img.jpg", f"http://[::1]:{port}/img.jpg"):
            with pytest.raises(InvalidMediaError, match="public address"):
                await c.fetch("image", f"{server.url}/redirect?to={target}")
        assert other.requests == 0
        async with MediaConnector() as default:
            for url in (server.url + "/img.jpg", f"http://localhost:{server.port}/img.jpg"):
                with pytest.raises(InvalidMediaError):
                    await default.fetch("image", url)  # default guard: loopback refused, by IP or by name
        async with MediaConnector(allow_private_networks=True) as open_guard:
            assert (await open_guard.fetch("image", f"http://127.0.0.2:{port}/img.jpg")).header.width == 128
    finally:
        await c.aclose()
        await runner.cleanup()


async def test_redirects_off_and_too_many(server):
    c = MediaConnector(allow_private_networks=LOCAL, allow_redirects=False)
    with pytest.raises(InvalidMediaError, match="redirects") as caught:  # this server's policy: a 400
        await c.fetch("image", f"{server.url}/redirect?to=/img.jpg")
    assert caught.value.status_code == 400 and not isinstance(caught.value, MediaFetchError)
    await c.aclose()
    loop_url = f"{server.url}/redirect?to=/redirect%3Fto%3D/redirect"
    c = MediaConnector(allow_private_networks=LOCAL, max_redirects=1)
    with pytest.raises(MediaFetchError):
        await c.fetch("image", loop_url)
    await c.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/x.jpg",
        "gopher://x",
        "http:///nohost",
        "javascript:alert(1)",
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00::1]/x",
        "http://10.0.0.1/x",
    ],
)
async def test_refused_urls(url):
    async with MediaConnector() as c:
        with pytest.raises(InvalidMediaError) as info:
            await c.fetch("image", url)
    assert info.value.status_code == 400


async def test_data_urls(image_bytes):
    c = MediaConnector(max_bytes=1 << 20)
    encoded = base64.b64encode(image_bytes).decode()
    item = await c.fetch("image", "data:image/jpeg;base64," + encoded)
    assert item.key == lazymedia.load_image(image_bytes).key
    for bad in (
        "data:image/jpeg;base64",
        "data:image/jpeg," + encoded,
        "data:image/jpeg;base64," + encoded[:-2] + "*=",
        "data:;base64,@@@@",
    ):
        with pytest.raises(InvalidMediaError):
            await c.fetch("image", bad)
    with pytest.raises(MediaTooLargeError):
        await MediaConnector(max_bytes=1000).fetch("image", "data:image/jpeg;base64," + encoded)


async def test_file_urls(tmp_path, image_bytes):
    root = tmp_path / "media"
    root.mkdir()
    (root / "a.jpg").write_bytes(image_bytes)
    (tmp_path / "secret.jpg").write_bytes(image_bytes)
    (root / "escape.jpg").symlink_to(tmp_path / "secret.jpg")
    os.mkfifo(root / "fifo.jpg")
    c = MediaConnector(allowed_local_path=root)
    assert (await c.fetch("image", f"file://{root}/a.jpg")).key == lazymedia.load_image(image_bytes).key
    for url in (
        f"file://{root}/../secret.jpg",
        f"file://{root}/escape.jpg",
        f"file://{root}/fifo.jpg",
        f"file://{root}",
        f"file://{root}/missing.jpg",
        "file://otherhost/etc/passwd",
        "file:///etc/passwd",
    ):
        with pytest.raises(InvalidMediaError):
            await asyncio.wait_for(c.fetch("image", url), 5)
    with pytest.raises(InvalidMediaError, match="refused"):
        await MediaConnector().fetch("image", f"file://{root}/a.jpg")


def test_sync_twins(tmp_path, image_bytes):
    (tmp_path / "a.jpg").write_bytes(image_bytes)
    c = MediaConnector(allowed_local_path=tmp_path)
    try:
        assert c.fetch_sync("image", f"file://{tmp_path}/a.jpg").header.width == 128
        with pytest.raises(InvalidMediaError):
            c.fetch_sync("image", "http://127.0.0.1:1/x.jpg")
    finally:
        c.close()


async def test_download_cache(server, tmp_path, image_bytes):
    async with MediaConnector(allow_private_networks=LOCAL, download_cache_dir=tmp_path / "dl") as c:
        first = await c.fetch("image", server.url + "/img.jpg")
        second = await c.fetch("image", server.url + "/img.jpg")
    assert server.requests == 1 and first.key == second.key
    async with MediaConnector(allow_private_networks=LOCAL) as uncached:
        await uncached.fetch("image", server.url + "/img.jpg")
    assert server.requests == 2


async def test_download_cache_is_checked_like_a_fresh_fetch(server, tmp_path):
    cache = tmp_path / "dl"
    async with MediaConnector(allow_private_networks=LOCAL, download_cache_dir=cache) as c:
        await c.fetch("image", server.url + "/img.jpg")
    async with MediaConnector(download_cache_dir=cache) as guarded:  # default guard: loopback refused
        with pytest.raises(InvalidMediaError, match="not a public address"):
            await guarded.fetch("image", server.url + "/img.jpg")
    async with MediaConnector(
        download_cache_dir=cache, allow_private_networks=True, allowed_domains=["example.com"]
    ) as other_domain:
        with pytest.raises(InvalidMediaError, match="not an allowed domain"):
            await other_domain.fetch("image", server.url + "/img.jpg")
    assert server.requests == 1


@pytest.fixture
def no_network(monkeypatch):
    """Fails loudly if anything tries to resolve or connect: proves the guard refused first."""
    import socket

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"connection attempted: {args[1:]}")

    for target, name in (
        (socket.socket, "connect"),
        (socket.socket, "connect_ex"),
        (socket, "getaddrinfo"),
        (asyncio.BaseEventLoop, "getaddrinfo"),
        (asyncio.BaseEventLoop, "create_connection"),
        (asyncio.BaseEventLoop, "sock_connect"),
    ):
        monkeypatch.setattr(target, name, refuse)
    return attempts


@pytest.mark.parametrize(
    "host",
    [
        "[::7f00:1]",
        "[::127.0.0.1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::ffff:0:7f00:1]",
        "[64:ff9b::7f00:1]",
        "[64:ff9b::a9fe:a9fe]",
        "[64:ff9b::10.0.0.1]",
        "[64:ff9b:1::8.8.8.8]",
        "[2002:a9fe:a9fe::1]",
        "[2002:7f00:1::]",
        "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo to 127.0.0.1
        "[fec0::1]",
        "[fe80::1]",
        "[::1]",
        "[::]",
        "[fd00::1]",
        "[ff02::1]",
        "2130706433",
        "0177.0.0.1",
        "127.1",
        "0x7f.1",
        "0x7f000001",
        "017700000001",
        "10.1",
        "169.254.43518",
    ],
)
async def test_guard_refuses_every_form_without_connecting(host, no_network):
    async with MediaConnector() as c:
        with pytest.raises(InvalidMediaError) as info:
            await c.fetch("image", f"http://{host}/x.jpg")
    assert info.value.status_code == 400 and not no_network


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8"]
)
def test_guard_permits_public_addresses(address):
    from lazymedia.guard import AddressGuard

    assert AddressGuard().permits(address)
    assert not AddressGuard().permits("127.0.0.1") and AddressGuard(["127.0.0.0/8"]).permits("::ffff:127.0.0.1")


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x",
        "http://\u2100.test/x",
        "http://host:99999/x",
        "http://host:-1/",
        "file:///tmp/a\x00b.jpg",
        "file:///tmp/a%00b.jpg",
        "",
        "://",
        None,
        42,
        b"http://x/",
    ],
)
async def test_malformed_urls_are_400(url, tmp_path):
    async with MediaConnector(allowed_local_path="/tmp") as c:
        with pytest.raises(InvalidMediaError) as info:
            await c.fetch("image", url)
    assert info.value.status_code == 400


async def test_data_urls_are_bounded_first_and_decoded_off_the_loop(image_bytes, monkeypatch):
    import threading

    from lazymedia import connector as connector_module

    threads = []
    decode = connector_module.from_base64

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return decode(*args, **kwargs)

    monkeypatch.setattr(connector_module, "from_base64", recording)
    url = "data:image/jpeg;base64," + base64.b64encode(image_bytes).decode()
    async with MediaConnector() as c:
        await c.fetch("image", url)
    assert threads and threads[0] is not threading.main_thread()
    async with MediaConnector(max_bytes=1000) as small:
        with pytest.raises(MediaTooLargeError):
            await small.fetch("image", "data:image/jpeg;base64," + "A" * (1 << 20))
    assert len(threads) == 1  # the oversized payload was refused before any decoding (or copy)


def test_file_url_symlink_swap_race_never_escapes(tmp_path, image_bytes):
    """Another thread swaps a directory for a symlink to outside the root, in a loop, while file:
    URLs below it are fetched: no fetch may return the outside file. Bounded by counts (until
    both outcomes were seen 20 times, at most 20,000 attempts), never by seconds."""
    import threading

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (root / "real" / "a.jpg").write_bytes(image_bytes)
    secret = encode(make_image(96, 128, seed=7), "JPEG")
    (outside / "a.jpg").write_bytes(secret)
    link = root / "d"
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            for target in (root / "real", outside):
                tmp = root / "d.tmp"
                tmp.symlink_to(target) if target == outside else os.symlink("real", tmp)
                os.replace(tmp, link)  # d -> real (inside, a relative symlink) or d -> outside
            try:
                os.unlink(link)
                os.mkdir(link)
                os.link(root / "real" / "a.jpg", link / "a.jpg")  # d is a real directory holding a.jpg
                os.unlink(link / "a.jpg")
                os.rmdir(link)
            except OSError:
                pass

    swapper = threading.Thread(target=swap)
    swapper.start()
    connector = MediaConnector(allowed_local_path=root)
    fetched = escapes = refused = attempts = 0
    try:
        while (fetched < 20 or refused < 20) and attempts < 20_000:
            attempts += 1
            try:
                data = connector.download_sync(f"file://{root}/d/a.jpg")
            except InvalidMediaError:
                refused += 1
                continue
            fetched += 1
            escapes += data == secret
    finally:
        stop.set()
        swapper.join()
        connector.close()
    assert escapes == 0 and fetched >= 20 and refused >= 20, (fetched, refused, attempts)


def test_connection_pools_of_closed_loops_are_dropped():
    connector = MediaConnector(allow_private_networks=True)

    async def one_fetch():
        with pytest.raises(MediaFetchError):
            await connector.fetch("image", "http://127.0.0.1:1/x.jpg")  # connection refused: 502

    for _ in range(20):
        asyncio.run(one_fetch())
    assert connector.open_pools <= 1
    connector.close()
    assert connector.open_pools == 0


# Spellings of 127.0.0.1 (and localhost) that are not plain ASCII: IDNA (UTS-46) maps them all to
# ASCII, and the HTTP client connects to what it maps them to.
UNICODE_FORMS = [
    "１２７.０.０.１",
    "127。0。0。1",
    "127．0．0．1",
    "127｡0｡0｡1",
    "①②⑦.⓪.⓪.①",
    "１２７。０。０。１",
    "127.0.0.１",
    "⑫⑦.0.0.1",
    "127.0.0.1。",
    "127.0.0.1．",
    "𝟏𝟐𝟕.𝟎.𝟎.𝟏",
    "¹²⁷.⁰.⁰.¹",
    "ｌｏｃａｌｈｏｓｔ",
]
FIRST_ROUND_FORMS = [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",
    "[::7f00:1]",
    "[::ffff:0:7f00:1]",
    "[2002:7f00:1::]",
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
    "2130706433",
    "0177.0.0.1",
    "127.1",
    "0x7f.1",
    "0x7f000001",
    "017700000001",
    "[::]",
    "0.0.0.0",
]


@pytest.mark.parametrize("host", UNICODE_FORMS[:-1])
async def test_non_ascii_spellings_of_addresses_are_400_before_any_connect(host, no_network):
    for allow in (False, True):  # no exemption admits these spellings
        async with MediaConnector(allow_private_networks=allow) as c:
            with pytest.raises(InvalidMediaError, match="non-ASCII spelling of an IP address") as info:
                await c.fetch("image", f"http://{host}:8080/x.jpg")
        assert info.value.status_code == 400 and not no_network


@pytest.mark.parametrize(
    "host",
    [
        "%31%32%37.0.0.1",
        "\u0661\u0662\u0667.0.0.1",
        "0x17f000001",
        "0x",
        "1.2.3.4.5",
        "a..b",
        "%00",
        "a%2fb",
        "x" * 64 + ".com",
    ],
)
async def test_malformed_hosts_are_400_before_any_resolve(host, no_network):
    for allow in (False, True):
        async with MediaConnector(allow_private_networks=allow) as c:
            with pytest.raises(InvalidMediaError, match="refused host") as info:
                await c.fetch("image", f"http://{host}/x.jpg")
        assert info.value.status_code == 400 and not no_network


async def test_a_host_with_a_trailing_dot_is_judged_without_it(server, image_bytes):
    async with MediaConnector() as c:  # "localhost." is localhost: refused by the guard, not a DNS failure
        with pytest.raises(InvalidMediaError, match="non-public") as info:
            await c.fetch("image", f"http://localhost.:{server.port}/img.jpg")
    assert info.value.status_code == 400
    async with MediaConnector(allow_private_networks=LOCAL) as c:
        item = await c.fetch("image", f"http://127.0.0.1.:{server.port}/img.jpg")
    assert item.key == lazymedia.load_image(image_bytes).key


async def test_no_spelling_reaches_a_loopback_server(server, image_bytes):
    """Every Unicode and first-round spelling of a loopback address, asked for directly and as a
    redirect's target from an allowed server: the loopback server sees no request at all."""
    origin = Server(image_bytes)
    runner, origin_port = await start(origin, "127.0.0.2")
    outcomes = {}
    try:
        async with MediaConnector(allow_private_networks=["127.0.0.2/32"], timeout_s=5) as c:
            for host in UNICODE_FORMS + FIRST_ROUND_FORMS:
                target = f"http://{host}:{server.port}/img.jpg"
                for url in (target, f"http://127.0.0.2:{origin_port}/raw_redirect?to={quote(target)}"):
                    with pytest.raises(MediaError) as info:
                        await c.download(url)
                    outcomes[url] = info.value.status_code
    finally:
        await runner.cleanup()
    assert server.requests == 0 and origin.redirects == len(UNICODE_FORMS + FIRST_ROUND_FORMS)
    assert set(outcomes.values()) == {400}, outcomes


async def test_the_connect_layer_refuses_an_address_the_url_checks_missed(server, image_bytes, monkeypatch):
    """With the URL-level address check switched off, the socket factory still refuses every
    connection to a loopback address (literals skip the resolver), on the first hop and after
    a redirect, before the server sees a request."""
    from lazymedia import connector as connector_module

    monkeypatch.setattr(connector_module, "canonical_ip", lambda host: None)
    origin = Server(image_bytes)
    runner, origin_port = await start(origin, "127.0.0.2")
    try:
        async with MediaConnector(allow_private_networks=["127.0.0.2/32"]) as c:
            for url in (
                server.url + "/img.jpg",
                f"http://[::ffff:127.0.0.1]:{server.port}/img.jpg",
                f"http://127.0.0.2:{origin_port}/redirect?to={server.url}/img.jpg",
            ):
                with pytest.raises(InvalidMediaError, match="not a public address") as info:
                    await c.fetch("image", url)
                assert info.value.status_code == 400
            assert (await c.fetch("image", f"http://127.0.0.2:{origin_port}/img.jpg")).header.width == 128
    finally:
        await runner.cleanup()
    assert server.requests == 0 and origin.requests == 1


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com\\@safe.example.org/x.jpg",
        "http://safe.example.org\\.evil.com/x",
        "http://evil.com@x@safe.example.org/x.jpg",
        "http://safe.example.org\t/x.jpg",
        "ht\ttp://safe.example.org/x.jpg",
        "http://safe.exa mple.org/x.jpg",
        "http://safe.example.org/a\\b.jpg",
    ],
)
async def test_ambiguous_urls_are_400_before_any_connect(url, no_network):
    async with MediaConnector(allowed_domains=["safe.example.org"], allow_private_networks=True) as c:
        with pytest.raises(InvalidMediaError, match="ambiguous URL") as info:
            await c.fetch("image", url)
    assert info.value.status_code == 400 and not no_network


async def test_the_allow_list_judges_the_host_the_client_connects_to(server):
    """A full-width name is what the client maps it to (localhost), for the allow-list too."""
    url = f"http://ｌｏｃａｌｈｏｓｔ:{server.port}/img.jpg"
    async with MediaConnector(allowed_domains=["localhost"], allow_private_networks=LOCAL) as c:
        assert (await c.fetch("image", url)).header.width == 128
    async with MediaConnector(allowed_domains=["example.org"], allow_private_networks=LOCAL) as c:
        with pytest.raises(InvalidMediaError, match="refused localhost: not an allowed domain"):
            await c.fetch("image", url)
    assert server.requests == 1


def not_regular_files(tmp_path):
    """(allowed root, file: URL, what the refusal says) for every kind of path that is not media."""
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty.jpg").write_bytes(b"")
    proc = f"/proc/{os.getpid()}"
    return [
        (tmp_path, f"file://{tmp_path}/dir", "a directory"),
        (tmp_path, f"file://{tmp_path}/dir/", "a directory"),
        (tmp_path, f"file://{tmp_path}/fifo", "not a regular file"),
        (tmp_path, f"file://{tmp_path}/empty.jpg", "an empty file"),
        (tmp_path, f"file://{tmp_path}/missing.jpg", "(?i)no such file"),
        ("/dev", "file:///dev/null", "not a regular file"),
        ("/dev", "file:///dev/zero", "not a regular file"),
        (proc, f"file://{proc}/mem", "proc filesystem"),
        (proc, f"file://{proc}/status", "proc filesystem"),
    ]


async def test_file_urls_that_are_not_regular_files_are_typed_400(tmp_path):
    for root, url, says in not_regular_files(tmp_path):
        with pytest.raises(InvalidMediaError, match=says) as info:
            await asyncio.wait_for(MediaConnector(allowed_local_path=root).fetch("image", url), 5)
        assert info.value.status_code == 400, url


def test_file_url_descriptors_stay_flat_over_1000_requests(tmp_path, image_bytes):
    (tmp_path / "a.jpg").write_bytes(image_bytes)
    cases = not_regular_files(tmp_path) + [(tmp_path, f"file://{tmp_path}/a.jpg", "")]
    connectors = {root: MediaConnector(allowed_local_path=root) for root, _, _ in cases}
    outcomes = {"ok": 0, "400": 0}
    try:
        for root, url, _ in cases:  # each connector's loop thread (an epoll fd, a pipe) exists before counting
            with contextlib.suppress(InvalidMediaError):
                connectors[root].download_sync(url)
        before = len(os.listdir("/proc/self/fd"))
        for i in range(1000):
            root, url, _ = cases[i % len(cases)]
            try:
                assert connectors[root].download_sync(url) == image_bytes
                outcomes["ok"] += 1
            except InvalidMediaError:
                outcomes["400"] += 1
        after = len(os.listdir("/proc/self/fd"))
    finally:
        for c in connectors.values():
            c.close()
    assert outcomes == {"ok": 100, "400": 900} and after <= before, (before, after)


def test_file_url_reads_stop_at_the_size_fstat_reported(tmp_path, image_bytes, monkeypatch):
    """A file that grows while read is refused: the read never goes past its size plus one byte."""
    from lazymedia import guard

    (tmp_path / "a.jpg").write_bytes(image_bytes)
    reads = []
    real_read = os.read

    def growing_read(fd, n):
        data = real_read(fd, n) or b"x" * n  # past the end, the file "grew"
        reads.append(len(data))
        return data

    monkeypatch.setattr(guard.os, "read", growing_read)
    with pytest.raises(InvalidMediaError, match="changed size"):
        guard.read_beneath(tmp_path, "a.jpg", 1 << 20)
    assert sum(reads) <= len(image_bytes) + 1


async def test_a_failed_connection_tells_the_client_what_not_where():
    """A 502's text says what failed; the address and port the host resolved to (aiohttp's text)
    stay in the operator's hint."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    c = MediaConnector(allow_private_networks=LOCAL, timeout_s=5)
    with pytest.raises(MediaFetchError) as info:
        await c.fetch("image", f"http://localhost:{port}/x.jpg")
    await c.aclose()
    assert info.value.status_code == 502
    assert "127.0.0.1" not in str(info.value) and "Connection refused" in str(info.value)
    assert "127.0.0.1" in info.value.hint  # where it went, for the operator's log
