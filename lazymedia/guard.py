"""What a URL may reach: the SSRF guard for addresses and the beneath-the-root open for local
files. The connector asks these before any connection or open, and again for what a name
resolves to, so no refused address or escaping path is ever touched."""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
from collections.abc import Iterable

from .errors import InvalidMediaError

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry an IPv4 address in their last 32 bits and reach it through a translator.
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")      # RFC 2765 IPv4-translated
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")        # RFC 6052
_NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")       # RFC 8215: the IPv4 may sit anywhere
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")                # deprecated ::a.b.c.d


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


class AddressGuard:
    """Refuses every address that is not globally routable: loopback, private, link-local (and so
    cloud metadata at 169.254.169.254), CGNAT, multicast, reserved, site-local, and every IPv6
    form that leads to such an IPv4 address. `allow_private_networks`: True turns the guard
    off; a list of networks (CIDR strings) exempts those."""

    def __init__(self, allow_private_networks: bool | Iterable[str] = False):
        self.allow_all = allow_private_networks is True
        self.allowed = [] if isinstance(allow_private_networks, bool) else \
            [ipaddress.ip_network(n, strict=False) for n in allow_private_networks]

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
            raise InvalidMediaError(f"refused {what}: {address} is not a public address (pass allow_private_networks "
                                    "to admit private networks)")


# Why a file: path would not open, as its reader can act on it (the OS text names no fix).
_OPEN_FAILURES: dict[int, str | None] = {
    errno.ELOOP: "a symbolic link on the way (file: URLs follow none): name the file itself",
    errno.ENOTDIR: "a part of the path is a symbolic link or a file, not a directory (file: URLs follow no links): "
                   "name the file itself",
    errno.ENOENT: "no such file below allowed_local_path",
    errno.EACCES: "the server may not read it"}


def read_beneath(root: str | os.PathLike, relative: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `relative` below `root`, opened one component at a time
    from a directory descriptor with O_NOFOLLOW, so no symlink (swapped in at any moment) and no
    `..` can lead outside `root`. FIFOs and devices are refused without blocking."""
    from .errors import MediaTooLargeError

    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise InvalidMediaError("refused path: it names no file below allowed_local_path, or has '..'")
    if any("\0" in p for p in parts):
        raise InvalidMediaError("refused path: it has a NUL byte")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise InvalidMediaError(f"the server cannot open its allowed_local_path ({exc.strerror}): check "
                                "MediaConnector(allowed_local_path=)") from None
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            except OSError as exc:  # ELOOP/ENOTDIR: a symlink or a file where a directory should be
                raise InvalidMediaError(f"cannot open {relative}: {_OPEN_FAILURES.get(exc.errno or 0, exc.strerror)}") \
                    from None
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            raise InvalidMediaError(f"cannot open {relative}: {_OPEN_FAILURES.get(exc.errno or 0, exc.strerror)}") \
                from None
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which raises IsADirectoryError for a directory
        os.close(file_fd)
        raise InvalidMediaError(f"refused {relative}: a directory or device, not a regular file: name a file")
    with os.fdopen(file_fd, "rb") as f:
        if info.st_size > max_bytes:
            raise MediaTooLargeError(f"{relative}: {info.st_size} bytes, over max_bytes ({max_bytes})")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise MediaTooLargeError(f"{relative} grew past max_bytes ({max_bytes}) while read")
    return data
