"""Metadata counted before FFmpeg or libsndfile parse it. FFmpeg stores tags in a dictionary
whose every insert scans the entries before it, so its header probe costs the square of the tag
count (50k FLAC comments: 19 CPU-s; 100k ID3 frames or MKV tags: minutes), and the probe is
where an attacker pays least. This walk reads only length fields (linear, constant memory) and
refuses (413) more than MAX_METADATA_ENTRIES tags in an ID3v2 tag, a FLAC Vorbis comment block
or a Matroska Tags element: at that count FFmpeg's probe costs milliseconds."""
from __future__ import annotations

from ..errors import MediaTooLargeError

MAX_METADATA_ENTRIES = 2000

_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
_MKV_SEGMENT, _MKV_CLUSTER, _MKV_TAGS, _MKV_TAG, _MKV_SIMPLE_TAG = 0x18538067, 0x1F43B675, 0x1254C367, 0x7373, 0x67C8
# Where the walk goes inside: the Segment and the tag hierarchy; a Cluster of unknown size too
# (it cannot be skipped, and its children have sizes).
_MKV_ENTERED = {_MKV_SEGMENT, _MKV_TAGS, _MKV_TAG, _MKV_SIMPLE_TAG}


def check_metadata(data, modality: str) -> None:
    """Refuses (413) a file whose ID3v2, FLAC or Matroska metadata holds more than
    MAX_METADATA_ENTRIES entries; anything the walk does not understand is left to the decoder."""
    view = memoryview(data).cast("B")
    start = _skip_id3(view, modality)
    if bytes(view[start:start + 4]) == b"fLaC":
        _check_flac(view, start + 4, modality)
    elif bytes(view[:4]) == _EBML_MAGIC:
        _check_matroska(view, modality)


def _refuse(what: str, count: int, modality: str) -> MediaTooLargeError:
    return MediaTooLargeError(f"{what} holds more than {MAX_METADATA_ENTRIES} entries ({count} counted): "
                              "strip the file's tags", modality=modality)


def _skip_id3(view: memoryview, modality: str) -> int:
    """The offset after the ID3v2 tags at the start (0 without), their frames counted."""
    offset = 0
    while len(view) - offset >= 10 and bytes(view[offset:offset + 3]) == b"ID3":
        version = view[offset + 3]
        size = _syncsafe(view[offset + 6:offset + 10])
        end = min(len(view), offset + 10 + size)
        _count_id3_frames(view, offset + 10, end, version, modality)
        offset = offset + 10 + size + (10 if view[offset + 5] & 0x10 else 0)  # footer
    return offset


def _syncsafe(four: memoryview) -> int:
    return (four[0] & 0x7F) << 21 | (four[1] & 0x7F) << 14 | (four[2] & 0x7F) << 7 | four[3] & 0x7F


def _count_id3_frames(view: memoryview, offset: int, end: int, version: int, modality: str) -> None:
    header = 6 if version == 2 else 10
    count = 0
    while offset + header <= end and view[offset] != 0:  # padding (zeros) ends the frames
        if version == 2:
            size = view[offset + 3] << 16 | view[offset + 4] << 8 | view[offset + 5]
        elif version == 4:
            size = _syncsafe(view[offset + 4:offset + 8])
        else:
            size = int.from_bytes(view[offset + 4:offset + 8], "big")
        count += 1
        if count > MAX_METADATA_ENTRIES:
            raise _refuse("the ID3 tag", count, modality)
        offset += header + size


def _check_flac(view: memoryview, offset: int, modality: str) -> None:
    blocks = 0
    while offset + 4 <= len(view):
        kind, last = view[offset] & 0x7F, view[offset] & 0x80
        length = view[offset + 1] << 16 | view[offset + 2] << 8 | view[offset + 3]
        blocks += 1
        if blocks > MAX_METADATA_ENTRIES:
            raise _refuse("the FLAC metadata", blocks, modality)
        body = offset + 4
        if kind == 4 and body + 4 <= len(view):  # VORBIS_COMMENT: vendor string, then the count
            vendor = int.from_bytes(view[body:body + 4], "little")
            at = body + 4 + vendor
            if at + 4 <= len(view):
                comments = int.from_bytes(view[at:at + 4], "little")
                if comments > MAX_METADATA_ENTRIES:
                    raise _refuse("the FLAC Vorbis comment block", comments, modality)
        if last:
            return
        offset = body + length


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
    for byte in view[offset + 1:offset + length]:
        value = value << 8 | byte
    unknown = not keep_marker and value == (1 << (7 * length)) - 1
    return value, length, unknown


def _check_matroska(view: memoryview, modality: str) -> None:
    """Walks the elements from the start, entering the Segment, unknown-size Clusters and the
    tag hierarchy and skipping everything else by its size; counts SimpleTags."""
    offset, tags = 0, 0
    while offset < len(view):
        element, id_length, _ = _vint(view, offset, keep_marker=True)
        size, size_length, unknown = _vint(view, offset + id_length, keep_marker=False)
        if not id_length or not size_length:
            return
        offset += id_length + size_length
        if element == _MKV_SIMPLE_TAG:
            tags += 1
            if tags > MAX_METADATA_ENTRIES:
                raise _refuse("the Matroska Tags", tags, modality)
        if element in _MKV_ENTERED or unknown:
            continue
        offset += size
