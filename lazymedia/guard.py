"""What a URL may reach: a media URL read once into a typed target (`read_target`: an http(s) URL
as the HTTP client's own parser reads it, nothing else; a data: or file: URL), the SSRF guard for
addresses and the beneath-the-root open for local files. The connector asks these before any
connection or open, for what a name resolves to, and for the address of every socket it opens,
so no refused address or escaping path is ever touched."""

from __future__ import annotations

import ctypes
import errno
import functools
import ipaddress
import os
import re
import socket
import stat
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from yarl import URL

from .errors import InvalidMediaError, MediaTooLargeError

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry an IPv4 address in their last 32 bits and reach it through a translator.
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 IPv4-translated
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052
_NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: the IPv4 may sit anywhere
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address maps to, embeds, or reaches through a translator
    (mapped, compatible, translated, NAT64, 6to4, both Teredo ends)."""
    found: list[ipaddress.IPv4Address] = []
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in _IPV4_COMPATIBLE or ip in _IPV4_TRANSLATED or ip in _NAT64_WELL_KNOWN:
        found.append(low32)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def canonical_ip(host: str) -> _IPAddress | None:
    """The address a URL host names literally (brackets and zone stripped), None for a name.
    Legacy numeric IPv4 spellings that resolvers accept (2130706433, 0177.0.0.1, 127.1, 0x7f.1)
    are refused: they hide an address behind what looks like a name."""
    literal = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(literal)
    except ValueError:
        pass
    try:
        socket.inet_aton(literal)
    except (OSError, ValueError):
        return None
    raise InvalidMediaError(f"refused host {host!r}: a non-canonical numeric IPv4 address (write it as a.b.c.d)")


# "scheme://authority" or a scheme-relative "//authority": the authority ends at the first / ? #.
_AUTHORITY = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?//([^/?#]*)")
# The dots IDNA (UTS-46) maps to "." besides NFKC's: ideographic, full-width, half-width ideographic.
_IDNA_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def read_http_url(text: str, base: URL | None = None) -> URL:
    """The URL an HTTP client request goes to, parsed by yarl (the parser aiohttp connects with),
    joined to `base` for a redirect's Location. Spellings that parsers read differently are 400s
    before anything is judged: a backslash (browsers read it as "/", others as part of the host),
    control characters or spaces before the path (yarl and browsers drop some, urllib keeps
    them), several "@" in the authority, and a host that is not plain ASCII but reads as an IP
    address once normalised (full-width or circled digits, ideographic full stops): no
    legitimate client writes an address that way."""
    if not isinstance(text, str):
        raise InvalidMediaError(f"a URL must be a string, got {type(text).__name__}")
    if "\\" in re.split(r"[?#]", text, maxsplit=1)[0]:
        raise InvalidMediaError("ambiguous URL: a backslash before the query")
    match = _AUTHORITY.match(text)
    authority = match.group(1) if match else None
    head = text[: match.end()] if match else re.split(r"[/?#]", text, maxsplit=1)[0]
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in head):
        raise InvalidMediaError("ambiguous URL: a control character or space before the path")
    if authority is not None and authority.count("@") > 1:
        raise InvalidMediaError("ambiguous URL: more than one '@' in the authority")
    try:
        url = URL(text)
        if base is not None:
            url = base.join(url)
        url.port  # noqa: B018  (raises ValueError for a malformed port)
    except (ValueError, TypeError, UnicodeError) as exc:
        raise InvalidMediaError(f"malformed URL: {exc}") from None
    url = _plain_host(url)
    if authority is not None and not authority.isascii():
        host = authority.rpartition("@")[2]
        spelled = unicodedata.normalize("NFKC", host.translate(_IDNA_DOTS)).lower()
        if _reads_as_address(spelled.rsplit(":", 1)[0] if spelled.count(":") == 1 else spelled) or _reads_as_address(
            url.raw_host or ""
        ):
            raise InvalidMediaError("refused host: a non-ASCII spelling of an IP address")
    return url


@dataclass(frozen=True)
class HttpTarget:
    """An http(s) URL as the HTTP client reads it (`read_http_url`): what the allow-lists judge and
    what the client requests."""

    url: URL


@dataclass(frozen=True)
class DataTarget:
    """A data: URL, kept whole (its payload is read, size-checked first, when the item is)."""

    text: str


@dataclass(frozen=True)
class FileTarget:
    """A file: URL's host ("" or "localhost" name this machine) and its percent-decoded path."""

    host: str
    path: str


Target = HttpTarget | DataTarget | FileTarget


def read_target(url: str | Target) -> Target:
    """The one reading of a media URL that every later step dispatches on; a target already read
    is returned as it is. Non-strings, malformed URLs (bad brackets or port, NFKC tricks) and
    schemes other than http(s), data: and file: are 400s."""
    if isinstance(url, (HttpTarget, DataTarget, FileTarget)):
        return url
    if not isinstance(url, str):
        raise InvalidMediaError(f"a URL must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a malformed port)
    except ValueError as exc:
        raise InvalidMediaError(f"malformed URL ({exc}): send an http(s), data: or file: URL") from None
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        return HttpTarget(read_http_url(url))
    if scheme == "data":
        return DataTarget(url)
    if scheme == "file":
        return FileTarget(parts.netloc, unquote(parts.path))
    raise InvalidMediaError(f"unsupported URL scheme {scheme!r}: use http(s), data: or file:")


# A host name's labels as a resolver takes them (IDNA names arrive here as xn-- ASCII).
_HOST_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
# WHATWG URL's "ends in a number": a last label of digits or 0x-hex makes the host an IPv4 address.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


def _plain_host(url: URL) -> URL:
    """`url` with its host checked as a name or an address (400 otherwise, before any resolver
    sees it) and one trailing dot dropped, so that "localhost." is judged as "localhost"."""
    host = (url.raw_host or "").lower()
    if not host or ":" in host:  # no host (judged later), or an IPv6 literal yarl has parsed
        return url
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
        url = url.with_host(host)
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]) and canonical_ip(host) is None:
        raise InvalidMediaError(
            f"refused host {host!r}: it reads as an IPv4 address but is not one (write it as a.b.c.d)"
        )
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidMediaError(
            f"refused host {host[:100]!r}: not a host name (letters, digits, '-' and '_' "
            "between dots) nor an IP address"
        )
    return url


def _reads_as_address(host: str) -> bool:
    """Whether `host` names an address rather than a name, in any spelling a resolver accepts."""
    literal = host.strip("[]").split("%", 1)[0].rstrip(".")
    if ":" in literal:
        return True  # only an IPv6 literal holds a ":" inside a host
    try:
        socket.inet_aton(literal)
    except (OSError, ValueError):
        return False
    return True


class AddressGuard:
    """Refuses every address that is not globally routable: loopback, private, link-local (and so
    cloud metadata at 169.254.169.254), CGNAT, multicast, reserved, site-local, and every IPv6
    form that leads to such an IPv4 address. `allow_private_networks`: True turns the guard
    off; a list of networks (CIDR strings) exempts those."""

    def __init__(self, allow_private_networks: bool | Iterable[str] = False):
        self.allow_all = allow_private_networks is True
        self.allowed = (
            []
            if isinstance(allow_private_networks, bool)
            else [ipaddress.ip_network(n, strict=False) for n in allow_private_networks]
        )

    def _exempt(self, ip: _IPAddress) -> bool:
        return any(ip.version == network.version and ip in network for network in self.allowed)

    def _public(self, ip: _IPAddress) -> bool:
        return ip.is_global and not ip.is_multicast

    def permits(self, address: str | _IPAddress) -> bool:
        if self.allow_all:
            return True
        ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%", 1)[0])
        if self._exempt(ip):
            return True
        if isinstance(ip, ipaddress.IPv4Address):
            return self._public(ip)
        if ip.is_site_local or ip in _NAT64_LOCAL_USE:
            return False
        embedded = embedded_ipv4(ip)
        if embedded:  # judged by where it leads: every IPv4 end must be public (or exempt)
            return all(self._exempt(v4) or self._public(v4) for v4 in embedded)
        return self._public(ip)

    def check(self, address: str | _IPAddress, what: str) -> None:
        if not self.permits(address):
            raise InvalidMediaError(
                f"refused {what}: {address} is not a public address",
                hint="MediaConnector(allow_private_networks=) admits private networks",
            )


# Why a file: path would not open, as its reader can act on it (the OS text names no fix).
_OPEN_FAILURES: dict[int, str | None] = {
    errno.ELOOP: "a symbolic link on the way (file: URLs follow none): name the file itself",
    errno.ENOTDIR: "a part of the path is a symbolic link or a file, not a directory (file: URLs follow no links): "
    "name the file itself",
    errno.ENOENT: "no such file below the folder this server reads",
    errno.EACCES: "the server may not read it",
}


def read_beneath(root: str | os.PathLike[str], relative: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `relative` below `root`, opened one component at a time
    from a directory descriptor with O_NOFOLLOW, so no symlink (swapped in at any moment) and no
    `..` can lead outside `root`. Directories, FIFOs, devices, sockets and the files of kernel
    pseudo-filesystems (/proc, /sys: no size, reads with side effects) are 400s, found by fstat
    on the opened descriptor without blocking; the read stops at the size fstat reported."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise InvalidMediaError(
            "refused path: it names no file below the folder this server reads, or has '..'",
            hint="MediaConnector(allowed_local_path=) names that folder",
        )
    if any("\0" in p for p in parts):
        raise InvalidMediaError("refused path: it has a NUL byte")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise InvalidMediaError(
            "the server cannot read file: URLs now",
            hint=f"MediaConnector(allowed_local_path=) cannot be opened ({exc.strerror})",
        ) from None
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            except OSError as exc:  # ELOOP/ENOTDIR: a symlink or a file where a directory should be
                raise InvalidMediaError(
                    f"cannot open {relative}: {_OPEN_FAILURES.get(exc.errno or 0, exc.strerror)}"
                ) from None
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise InvalidMediaError(
                f"cannot open {relative}: {_OPEN_FAILURES.get(exc.errno or 0, exc.strerror)}"
            ) from None
    finally:
        os.close(fd)
    try:
        return _read_regular(file_fd, relative, max_bytes)
    finally:
        os.close(file_fd)


def _read_regular(fd: int, name: str, max_bytes: int) -> bytes:
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        raise InvalidMediaError(f"refused {name}: a directory, not a file: name a file")
    if not stat.S_ISREG(info.st_mode):
        raise InvalidMediaError(f"refused {name}: not a regular file (a device, FIFO or socket)")
    pseudo = _pseudo_filesystem(fd)
    if pseudo is not None:
        raise InvalidMediaError(f"refused {name}: a file of the kernel's {pseudo} filesystem")
    if info.st_size == 0:
        raise InvalidMediaError(f"refused {name}: an empty file")
    if info.st_size > max_bytes:
        raise MediaTooLargeError(
            f"{name}: {info.st_size} bytes, over the {max_bytes}-byte limit",
            hint="raise MediaConnector(max_bytes=)",
            limit="max_bytes",
            value=info.st_size,
            maximum=max_bytes,
        )
    chunks, received = [], 0
    while received <= info.st_size:  # one byte past the size tells a file that grows while read
        try:
            chunk = os.read(fd, info.st_size + 1 - received)
        except OSError as exc:
            raise InvalidMediaError(f"cannot read {name}: {exc.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
        received += len(chunk)
    if received != info.st_size:
        raise InvalidMediaError(f"refused {name}: it changed size while read")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# f_type of the kernel pseudo-filesystems whose files report no size or change on read.
_PSEUDO_FILESYSTEMS = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0xDE5E81E4: "efivarfs",
    0xCAFE4A11: "bpf",
    0x62656570: "configfs",
}


def _pseudo_filesystem(fd: int) -> str | None:
    """The name of the kernel pseudo-filesystem `fd` lives on, None elsewhere (or off Linux)."""
    libc = _libc()
    if libc is None:
        return None
    buffer = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first field, a long
    if libc.fstatfs(fd, buffer) != 0:
        return None
    return _PSEUDO_FILESYSTEMS.get(ctypes.c_ulong.from_buffer(buffer).value & 0xFFFFFFFF)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
