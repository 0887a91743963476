"""Metadata counted before FFmpeg or libsndfile parse it. FFmpeg stores tags in one dictionary
per file whose every insert scans the entries before it, so its header probe costs the square of
the file's tag count, wherever the tags lie (50k FLAC comments: 19 CPU-s; 50 ID3 tags of 2,000
frames each: 104 CPU-s; 50k MP4 `mdta` keys: 17-22 CPU-s), and the probe is where an attacker
pays least. These walks read only length fields and keep one count for the whole file: every ID3v2
tag and frame of the chain at the start, every FLAC metadata block and Vorbis comment, every MP4
`udta` entry, `keys` key and `ilst` item, every Matroska SimpleTag, every RIFF INFO entry, AIFF
text chunk and frame of an ID3 chunk in a WAV, AVI or AIFF. Past MAX_METADATA_ENTRIES in all it
is a 413, so splitting the tags over many tags, blocks or boxes does not get round it. The walks
stop there, so their own cost is at most that many entries plus MAX_WALKED_UNITS container units
(boxes, elements, chunks) stepped over (more is a 413 too); at that count FFmpeg's probe costs
milliseconds. Entries are counted as they are found, never from a count field, so a garbage count
in a tiny file is not a count of entries. Ogg streams' comment packets (Vorbis, Opus, Theora,
Speex, FLAC's blocks) count too; APE tags do not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from ..errors import MediaTooLargeError, UnprocessableMediaError

if TYPE_CHECKING:
    from .types import EncodedBytes

MAX_METADATA_ENTRIES = 2000
# Boxes or elements a walk steps over to find the metadata, at most (their sizes make each step
# O(1): about 1 CPU-s for this many); past it the file is refused (413), since tags could follow
# where the walk stopped. A fragmented hour at one fragment per frame, 60 fps, is 432 k boxes; an
# hour of a browser's live WebM (clusters of unknown size, every block walked) about 300 k blocks.
MAX_WALKED_UNITS = 1 << 20

_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
_MKV_SEGMENT, _MKV_TAGS, _MKV_TAG, _MKV_SIMPLE_TAG = 0x18538067, 0x1254C367, 0x7373, 0x67C8
# Where the walk goes inside: the Segment and the tag hierarchy; a Cluster of unknown size too
# (it cannot be skipped, and its children have sizes).
_MKV_ENTERED = {_MKV_SEGMENT, _MKV_TAGS, _MKV_TAG, _MKV_SIMPLE_TAG}
# ISO BMFF / QuickTime boxes the metadata walk enters (FFmpeg's mov reader parses `udta` and
# `meta` wherever they lie); the children of `udta` and `ilst` are one entry each, a `keys` box
# holds entries of its own.
_MP4_ENTERED = {b"moov", b"trak", b"udta", b"meta", b"ilst", b"keys"}
# First boxes of an ISO BMFF / QuickTime file.
MP4_FIRST_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"styp", b"moof"}


class MetadataCount:
    """The file's one count of metadata entries, by the part of the file that holds them: past
    MAX_METADATA_ENTRIES in all, a 413 that names the total and the parts."""

    def __init__(self, modality: str):
        self.modality = modality
        self.total = 0
        self.parts: dict[str, int] = {}

    def add(self, part: str) -> None:
        self.total += 1
        self.parts[part] = self.parts.get(part, 0) + 1
        if self.total > MAX_METADATA_ENTRIES:
            found = ", ".join(f"{count} {part}" for part, count in self.parts.items())
            raise MediaTooLargeError(
                f"the file's metadata holds more than {MAX_METADATA_ENTRIES} entries in all "
                f"(counted {self.total} before stopping: {found}): strip the file's tags",
                modality=self.modality,
            )


def _too_long_a_walk(units: str, modality: str) -> MediaTooLargeError:
    return MediaTooLargeError(
        f"the file has more than {MAX_WALKED_UNITS} {units} to step over where its tags may "
        "lie: re-encode the file or send another",
        modality=modality,
    )


def check_metadata(data: EncodedBytes, modality: str) -> None:
    """Refuses (413) a file whose ID3v2, FLAC, MP4 or Matroska metadata holds more than
    MAX_METADATA_ENTRIES entries in all, and (422) an MP4 `keys` box whose count its bytes
    cannot hold (FFmpeg allocates by that count); anything the walk does not understand is left
    to the decoder."""
    view = memoryview(data).cast("B")
    count = MetadataCount(modality)
    start = _count_id3_chain(view, count)
    if bytes(view[start : start + 4]) == b"fLaC":
        _count_flac(view, start + 4, count)
    elif bytes(view[:4]) == _EBML_MAGIC:
        _count_matroska(view, count)
    elif bytes(view[4:8]) in MP4_FIRST_BOXES:
        _count_mp4(view, count)
    elif bytes(view[:4]) in (b"RIFF", b"FORM"):
        _count_chunks(view, count)
    elif bytes(view[:4]) == b"OggS":
        _count_ogg(view, count)


def _count_id3_chain(view: memoryview, count: MetadataCount) -> int:
    """The offset after the ID3v2 tags at the start (FFmpeg reads every one of a chain into the
    same dictionary), each tag and frame counted; 0 without."""
    offset = 0
    while len(view) - offset >= 10 and bytes(view[offset : offset + 3]) == b"ID3":
        count.add("ID3v2 tags")
        version, flags = view[offset + 3], view[offset + 5]
        size = _syncsafe(view[offset + 6 : offset + 10])
        end = min(len(view), offset + 10 + size)
        _count_id3_frames(view, offset + 10, end, version, flags, count)
        offset = offset + 10 + size + (10 if flags & 0x10 else 0)  # footer
    return offset


def _syncsafe(four: memoryview) -> int:
    return (four[0] & 0x7F) << 21 | (four[1] & 0x7F) << 14 | (four[2] & 0x7F) << 7 | four[3] & 0x7F


def _count_id3_frames(view: memoryview, offset: int, end: int, version: int, flags: int, count: MetadataCount) -> None:
    if flags & 0x40 and version in (3, 4) and offset + 4 <= end:  # an extended header comes first
        if version == 3:
            offset += 4 + int.from_bytes(view[offset : offset + 4], "big")
        else:
            offset += _syncsafe(view[offset : offset + 4])
    header = 6 if version == 2 else 10
    while offset + header <= end and view[offset] != 0:  # padding (zeros) ends the frames
        if version == 2:
            size = view[offset + 3] << 16 | view[offset + 4] << 8 | view[offset + 5]
        elif version == 4:
            size = _syncsafe(view[offset + 4 : offset + 8])
        else:
            size = int.from_bytes(view[offset + 4 : offset + 8], "big")
        count.add("ID3v2 frames")
        offset += header + size


def _count_flac(view: memoryview, offset: int, count: MetadataCount) -> None:
    """Counts every metadata block and every Vorbis comment of every VORBIS_COMMENT block, the
    comments by their own lengths (the block's count field only bounds them)."""
    while offset + 4 <= len(view):
        kind, last = view[offset] & 0x7F, view[offset] & 0x80
        length = view[offset + 1] << 16 | view[offset + 2] << 8 | view[offset + 3]
        count.add("FLAC metadata blocks")
        body = offset + 4
        if kind == 4:  # VORBIS_COMMENT: vendor string, the count, then the comments
            _count_vorbis_comments(view, body, min(len(view), body + length), count)
        if last:
            return
        offset = body + length


def _count_vorbis_comments(view: memoryview, at: int, end: int, count: MetadataCount) -> None:
    if at + 4 > end:
        return
    at += 4 + int.from_bytes(view[at : at + 4], "little")  # the vendor string
    if at + 4 > end:
        return
    declared = int.from_bytes(view[at : at + 4], "little")
    at += 4
    for _ in range(declared):
        if at + 4 > end:
            return
        at += 4 + int.from_bytes(view[at : at + 4], "little")
        if at > end:  # a comment its block cannot hold: the parser stops there too
            return
        count.add("Vorbis comments")


# Chunks of a RIFF (WAV, AVI) or IFF (AIFF) file whose every sub-chunk or chunk is one dictionary
# entry in FFmpeg: a LIST of type INFO, and AIFF's text chunks.
_AIFF_TEXT_CHUNKS = {b"NAME", b"AUTH", b"(c) ", b"ANNO", b"COMT"}


def _count_chunks(view: memoryview, count: MetadataCount) -> None:
    """Walks a RIFF (little-endian sizes) or AIFF (big-endian) file's chunks, entering LIST
    chunks (AVI nests its INFO in them), stepping over the rest by their sizes: each sub-chunk of
    an INFO list, each AIFF text chunk and each frame of an embedded ID3v2 tag (`id3 `, `ID3 `)
    is an entry."""
    order: Literal["little", "big"] = "little" if bytes(view[:4]) == b"RIFF" else "big"
    pending = [(12, min(len(view), 8 + int.from_bytes(view[4:8], order)), False)]
    walked = 0
    while pending:
        offset, end, info = pending.pop()
        while offset + 8 <= end:
            walked += 1
            if walked > MAX_WALKED_UNITS:
                raise _too_long_a_walk("chunks", count.modality)
            kind, size = bytes(view[offset : offset + 4]), int.from_bytes(view[offset + 4 : offset + 8], order)
            body, after = offset + 8, min(end, offset + 8 + size)
            if info or (order == "big" and kind in _AIFF_TEXT_CHUNKS):
                count.add("RIFF INFO or AIFF text chunks")
            elif kind == b"LIST" and body + 4 <= after:
                pending.append((body + 4, after, bytes(view[body : body + 4]) == b"INFO"))
            elif kind in (b"id3 ", b"ID3 ") and after - body >= 10 and bytes(view[body : body + 3]) == b"ID3":
                _count_id3_frames(view, body + 10, after, view[body + 3], view[body + 5], count)
            offset = body + size + (size & 1)  # chunks are padded to an even size


# Where an Ogg stream's comment packet keeps its Vorbis comments, by the first packet's magic:
# (the comment packet's magic, where its comments start).
_OGG_COMMENTS = {
    b"\x01vorbis": (b"\x03vorbis", 7),
    b"OpusHead": (b"OpusTags", 8),
    b"\x80theora": (b"\x81theora", 7),
    b"Speex   ": (b"", 0),
}
_OGG_FLAC = b"\x7fFLAC"  # FLAC in Ogg: its metadata blocks follow, a packet each


class _OggStream:
    """What the walk keeps of one logical stream: its packets so far, the one being put together
    (header packets only), its codec's first-packet magic, and whether its headers are done."""

    def __init__(self) -> None:
        self.packets = 0
        self.packet = bytearray()
        self.magic = b""
        self.done = False


def _count_ogg(view: memoryview, count: MetadataCount) -> None:
    """Walks an Ogg file's pages (each a unit of the walk) and puts together the header packets
    of each logical stream: the comment packet of a Vorbis, Opus, Theora or Speex stream, and
    every metadata block of a FLAC one, counted as `_count_flac` counts them."""
    streams: dict[int, _OggStream] = {}
    offset, walked = 0, 0
    while offset + 27 <= len(view) and bytes(view[offset : offset + 4]) == b"OggS":
        walked += 1
        if walked > MAX_WALKED_UNITS:
            raise _too_long_a_walk("pages", count.modality)
        serial, segments = int.from_bytes(view[offset + 14 : offset + 18], "little"), view[offset + 26]
        at = offset + 27 + segments
        stream = streams.setdefault(serial, _OggStream())
        for length in view[offset + 27 : offset + 27 + segments]:
            if not stream.done:
                stream.packet += view[at : at + length]
            at += length
            if length < 255:  # a packet ends here
                _ogg_packet(stream, count)
        offset = at


def _ogg_packet(stream: _OggStream, count: MetadataCount) -> None:
    packet, stream.packet = memoryview(stream.packet), bytearray()
    stream.packets += 1
    if stream.done:
        return
    if stream.packets == 1:  # the codec's identification header
        stream.magic = next(
            (magic for magic in (*_OGG_COMMENTS, _OGG_FLAC) if bytes(packet[: len(magic)]) == magic), b""
        )
        stream.done = not stream.magic
    elif stream.magic == _OGG_FLAC:  # a metadata block a packet, the last one flagged
        count.add("FLAC metadata blocks")
        if len(packet) >= 4 and packet[0] & 0x7F == 4:
            _count_vorbis_comments(packet, 4, len(packet), count)
        stream.done = len(packet) == 0 or bool(packet[0] & 0x80)
    else:
        magic, start = _OGG_COMMENTS[stream.magic]
        if bytes(packet[: len(magic)]) == magic:
            _count_vorbis_comments(packet, start, len(packet), count)
        stream.done = True


def mp4_boxes(data: memoryview, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in [start, end); 64-bit and to-the-end
    sizes as ISO 14496-12 says; a box that overruns is cut at `end` (a truncated file)."""
    while start + 8 <= end:
        size, kind = int.from_bytes(data[start : start + 4], "big"), bytes(data[start + 4 : start + 8])
        header = 8
        if size == 1 and start + 16 <= end:
            size, header = int.from_bytes(data[start + 8 : start + 16], "big"), 16
        elif size == 0:
            size = end - start
        if size < header:
            return
        yield kind, start + header, min(start + size, end)
        start += size


def _count_mp4(view: memoryview, count: MetadataCount) -> None:
    """Walks the boxes that hold metadata (`moov`, `trak`, `udta`, `meta`, `ilst`, `keys`,
    wherever they nest), stepping over the rest by their sizes: each child of `udta` or `ilst`
    and each key of `keys` is an entry."""
    pending: list[tuple[bytes, int, int]] = [(b"", 0, len(view))]
    walked = 0
    while pending:
        parent, start, end = pending.pop()
        if parent == b"keys":
            _count_mp4_keys(view, start, end, count)
            continue
        if parent == b"meta":
            start = _meta_children(view, start, end)
        for kind, body_start, body_end in mp4_boxes(view, start, end):
            walked += 1
            if walked > MAX_WALKED_UNITS:
                raise _too_long_a_walk("boxes", count.modality)
            if parent == b"ilst" or (parent == b"udta" and kind != b"meta"):
                count.add(f"MP4 {parent.decode()} entries")
            if kind in _MP4_ENTERED and parent != b"ilst":
                pending.append((kind, body_start, body_end))


def _meta_children(view: memoryview, start: int, end: int) -> int:
    """Where a `meta` box's children start: ISO's is a full box (4 bytes of version and flags,
    zero, first), QuickTime's is not (a child's size, never zero, comes first)."""
    return start + 4 if start + 4 <= end and not any(view[start : start + 4]) else start


def _count_mp4_keys(view: memoryview, start: int, end: int, count: MetadataCount) -> None:
    """A `keys` box (QuickTime `mdta` metadata): version and flags, a count, then the keys (size,
    namespace, name). FFmpeg allocates an array by the count before reading a key, so a count its
    bytes cannot hold is a 422; the keys are counted as walked."""
    if start + 8 > end:
        return
    declared = int.from_bytes(view[start + 4 : start + 8], "big")
    if declared * 8 > end - start - 8:
        raise UnprocessableMediaError(
            f"MP4 keys declares {declared} keys in {end - start} bytes: the file is "
            "damaged; re-encode the file or send another",
            modality=count.modality,
        )
    at = start + 8
    for _ in range(declared):
        if at + 8 > end:
            return
        size = int.from_bytes(view[at : at + 4], "big")
        if size < 8:
            return
        count.add("MP4 keys")
        at += size


def _vint(view: memoryview, offset: int, keep_marker: bool) -> tuple[int, int, bool]:
    """(value, length, unknown) of the EBML variable-size integer at `offset`; length 0 when
    malformed or cut."""
    if offset >= len(view) or view[offset] == 0:
        return 0, 0, False
    first = view[offset]
    length = 9 - first.bit_length()
    if offset + length > len(view):
        return 0, 0, False
    value = first if keep_marker else first & (0xFF >> length)
    for byte in view[offset + 1 : offset + length]:
        value = value << 8 | byte
    unknown = not keep_marker and value == (1 << (7 * length)) - 1
    return value, length, unknown


def _count_matroska(view: memoryview, count: MetadataCount) -> None:
    """Walks the elements from the start, entering the Segment, unknown-size Clusters and the
    tag hierarchy and skipping everything else by its size; counts SimpleTags (in every Tags
    element, nested ones included)."""
    offset, walked = 0, 0
    while offset < len(view):
        walked += 1
        if walked > MAX_WALKED_UNITS:
            raise _too_long_a_walk("elements", count.modality)
        element, id_length, _ = _vint(view, offset, keep_marker=True)
        size, size_length, unknown = _vint(view, offset + id_length, keep_marker=False)
        if not id_length or not size_length:
            return
        offset += id_length + size_length
        if element == _MKV_SIMPLE_TAG:
            count.add("Matroska SimpleTags")
        if element in _MKV_ENTERED or unknown:
            continue
        offset += size
