"""The metadata count (codecs/_metadata.py) holds over the whole file: tags split over many ID3
tags, FLAC comment blocks, MP4 boxes or Matroska Tags elements are refused (413) as one total,
through load_audio and load_video, within a few CPU-seconds, in a child process (run_capped: an
address-space cap and a time-out); a count field is never read as a count of entries."""

import pytest
from test_hostile import MKV_TAGS, run_capped

from lazymedia import MediaError, MediaTooLargeError, UnprocessableMediaError
from lazymedia.codecs._metadata import MAX_METADATA_ENTRIES, MAX_WALKED_UNITS, check_metadata

_EBML_HEADER = b"\x1a\x45\xdf\xa3\x80"  # an empty EBML header
BOMB_CPU_SECONDS = 5.0  # the bound (FFmpeg took 17 s to minutes on these files)
LOADS = {"audio": "lazymedia.load_audio(data)", "video": "lazymedia.load_video(data, num_frames=4)"}

# `parts` ID3v2.3 tags of `entries` TXXX frames each, chained before an MP3.
ID3_CHAIN = r"""
def id3_tag(frames):
    body = b"".join(b"TXXX" + (3).to_bytes(4, "big") + b"\x00\x00" + b"\x00a\x00" for _ in range(frames))
    size = len(body)
    syncsafe = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
    return b"ID3\x03\x00\x00" + syncsafe + body
data = id3_tag({entries}) * {parts} + synthetic.tone(0.5, fmt="mp3")
"""

# A FLAC with `parts` VORBIS_COMMENT blocks of `entries` comments each after its STREAMINFO.
FLAC_BLOCKS = r"""
import struct as _struct
flac = synthetic.tone(0.5, fmt="flac")
assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0  # STREAMINFO first, not the last block
comments = b"".join(_struct.pack("<I", 7) + b"T=%05d" % i for i in range({entries}))
body = _struct.pack("<I", 6) + b"vendor" + _struct.pack("<I", {entries}) + comments
block = bytes([4]) + len(body).to_bytes(3, "big") + body
data = flac[:42] + block * {parts} + flac[42:]
"""

# An MP4 whose moov ends with FFmpeg's `mdta` metadata (movflags=use_metadata_tags): a meta box
# holding hdlr 'mdta', `keys` with `entries` keys and an ilst item for each.
MP4_MDTA_KEYS = r"""
def box(kind, body):
    return (8 + len(body)).to_bytes(4, "big") + kind + body
clip = synthetic.video(frames=8, height=64, width=64)
moov = clip.index(b"moov") - 4
assert clip.index(b"mdat") < moov  # moov last: growing it moves no sample
names = [b"com.example.key%06d" % i for i in range({entries})]
keys = box(b"keys", bytes(4) + len(names).to_bytes(4, "big") + b"".join(box(b"mdta", name) for name in names))
items = b"".join(box((i + 1).to_bytes(4, "big"), box(b"data", (1).to_bytes(4, "big") + bytes(4) + b"v"))
                 for i in range(len(names)))
hdlr = box(b"hdlr", bytes(8) + b"mdta" + bytes(12) + b"\0")
meta = box(b"meta", bytes(4) + hdlr + keys + box(b"ilst", items)) * {parts}
size = int.from_bytes(clip[moov:moov + 4], "big")
data = clip[:moov] + (size + len(meta)).to_bytes(4, "big") + clip[moov + 4:moov + size] + meta + clip[moov + size:]
"""

# A WAV with `parts` LIST INFO chunks of `entries` distinct entries each after its data.
WAV_INFO_LISTS = r"""
wav = synthetic.tone(0.5, fmt="wav")
info = b"".join(b"I%03X" % (i % 4096) + (2).to_bytes(4, "little") + b"a\0" for i in range({entries}))
lists = (b"LIST" + (4 + len(info)).to_bytes(4, "little") + b"INFO" + info) * {parts}
data = b"RIFF" + (len(wav) - 8 + len(lists)).to_bytes(4, "little") + wav[8:] + lists
"""

# A WAV with `parts` `id3 ` chunks, each an ID3v2.3 tag of `entries` TXXX frames.
WAV_ID3_CHUNKS = r"""
wav = synthetic.tone(0.5, fmt="wav")
body = b"".join(b"TXXX" + (3).to_bytes(4, "big") + b"\x00\x00" + b"\x00a\x00" for _ in range({entries}))
size = len(body)
tag = b"ID3\x03\x00\x00" + bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F]) + body
chunks = (b"id3 " + len(tag).to_bytes(4, "little") + tag + bytes(len(tag) & 1)) * {parts}
data = b"RIFF" + (len(wav) - 8 + len(chunks)).to_bytes(4, "little") + wav[8:] + chunks
"""

# `parts` logical Ogg Vorbis streams, each a comment packet of `entries` comments (pages cut at 255
# segments, CRCs left zero: refused before anything checks them), before a real Ogg Vorbis file.
OGG_VORBIS_STREAMS = r"""
import struct as _struct
def pages(serial, packets):
    lacing, body = [], b""
    for packet in packets:
        lacing += [255] * (len(packet) // 255) + [len(packet) % 255]
        body += packet
    out, at, sequence = b"", 0, 0
    while lacing:
        chunk, lacing = lacing[:255], lacing[255:]
        size = sum(chunk)
        flags = (2 if sequence == 0 else 0) | (1 if at and lacing_before[0] == 255 else 0)
        out += b"OggS\0" + bytes([flags]) + bytes(8) + _struct.pack("<III", serial, sequence, 0) + bytes([len(chunk)])
        out += bytes(chunk) + body[at:at + size]
        lacing_before = chunk[-1:]
        at, sequence = at + size, sequence + 1
    return out
comments = b"".join(_struct.pack("<I", 7) + b"T=%05d" % i for i in range({entries}))
comment = b"\x03vorbis" + _struct.pack("<I", 6) + b"vendor" + _struct.pack("<I", {entries}) + comments + b"\x01"
ident = b"\x01vorbis" + bytes(23)
data = b"".join(pages(1000 + s, [ident, comment]) for s in range({parts})) + synthetic.tone(0.5, fmt="ogg")
"""

BOMBS = {
    "id3_chain": ID3_CHAIN,
    "flac_blocks": FLAC_BLOCKS,
    "mp4_mdta_keys": MP4_MDTA_KEYS,
    "mkv_tags": MKV_TAGS,
    "wav_info_lists": WAV_INFO_LISTS,
    "wav_id3_chunks": WAV_ID3_CHUNKS,
    "ogg_vorbis_streams": OGG_VORBIS_STREAMS,
}


@pytest.mark.parametrize("modality", sorted(LOADS))
@pytest.mark.parametrize(
    "bomb, parts, entries",
    [
        ("id3_chain", 50, 2000),
        ("id3_chain", 100, 2000),
        ("flac_blocks", 50, 2000),
        ("flac_blocks", 100, 2000),
        ("mp4_mdta_keys", 1, 50_000),
        ("mp4_mdta_keys", 100, 2000),
        ("mkv_tags", 100, 2000),
        ("wav_info_lists", 50, 2000),
        ("wav_id3_chunks", 50, 2000),
        ("ogg_vorbis_streams", 1, 50_000),
        ("ogg_vorbis_streams", 50, 2000),
    ],
)
def test_metadata_split_over_many_parts_is_refused_as_one_total(bomb, parts, entries, modality):
    report = run_capped(BOMBS[bomb].format(parts=parts, entries=entries), LOADS[modality])
    assert report["outcome"] == "refused" and report["status"] == 413, report
    assert f"more than {MAX_METADATA_ENTRIES} entries in all" in report["error"], report
    assert report["cpu_seconds"] < BOMB_CPU_SECONDS, report


@pytest.mark.parametrize(
    "bomb, parts, entries, load",
    [
        ("id3_chain", 2, 990, LOADS["audio"]),
        ("flac_blocks", 2, 990, LOADS["audio"]),
        ("mp4_mdta_keys", 1, 990, LOADS["video"]),
        ("mkv_tags", 2, 990, LOADS["video"]),
        ("wav_info_lists", 2, 990, LOADS["audio"]),
        ("wav_id3_chunks", 2, 990, LOADS["audio"]),
    ],
)
def test_metadata_under_the_total_decodes(bomb, parts, entries, load):
    report = run_capped(BOMBS[bomb].format(parts=parts, entries=entries), load)
    assert report["outcome"] == "decoded", report
    assert report["cpu_seconds"] < BOMB_CPU_SECONDS, report


def _flac_with_comment_count(declared: int) -> bytes:
    body = (0).to_bytes(4, "little") + declared.to_bytes(4, "little") + b"\x07\x00\x00\x00T=1"
    return b"fLaC" + bytes([0x84]) + len(body).to_bytes(3, "big") + body + bytes(36 - 8 - len(body))


def test_a_garbage_count_field_is_not_a_count_of_entries():
    data = _flac_with_comment_count(0x280000)  # 2,621,440 comments declared in a 36-byte file
    assert len(data) == 36
    check_metadata(data, "audio")  # one block, one comment: not over the total
    keys = (16).to_bytes(4, "big") + b"keys" + bytes(4) + (1 << 30).to_bytes(4, "big")
    clip = (
        (8).to_bytes(4, "big")
        + b"ftyp"
        + (8 + 8 + len(keys)).to_bytes(4, "big")
        + b"moov"
        + (8 + len(keys)).to_bytes(4, "big")
        + b"meta"
        + keys
    )
    with pytest.raises(UnprocessableMediaError, match="declares 1073741824 keys in 8 bytes"):
        check_metadata(clip, "video")  # FFmpeg would allocate 8 GiB of key slots by that count


@pytest.mark.parametrize("modality", sorted(LOADS))
def test_a_tiny_file_with_a_garbage_comment_count_gets_a_typed_error_that_is_not_a_count(modality):
    data = _flac_with_comment_count(0x280000)
    report = run_capped(f"data = {data!r}", LOADS[modality])
    assert report["outcome"] == "refused", report
    assert "2621440" not in report["error"] and report["cpu_seconds"] < BOMB_CPU_SECONDS, report


def test_the_refusal_names_the_total_and_its_parts():
    tag = b"ID3\x03\x00\x00" + (0).to_bytes(4, "big")  # an empty tag: one entry of its own
    with pytest.raises(MediaTooLargeError) as refused:
        check_metadata(tag * (MAX_METADATA_ENTRIES + 5), "audio")
    assert isinstance(refused.value, MediaError) and refused.value.status_code == 413
    assert f"counted {MAX_METADATA_ENTRIES + 1} before stopping: {MAX_METADATA_ENTRIES + 1} ID3v2 tags" in str(
        refused.value
    )


def test_tags_after_more_units_than_the_walk_steps_over_are_refused_not_skipped():
    """A million tiny blocks in a cluster of unknown size, then the tags: the walk does not stop
    short of them and pass the file on uncounted."""
    unknown = b"\x01\xff\xff\xff\xff\xff\xff\xff"
    data = (
        _EBML_HEADER
        + b"\x18\x53\x80\x67"
        + unknown
        + b"\x1f\x43\xb6\x75"
        + unknown
        + b"\xa3\x81\x00" * (MAX_WALKED_UNITS + 1)
    )
    with pytest.raises(MediaTooLargeError, match=f"more than {MAX_WALKED_UNITS} elements"):
        check_metadata(data, "video")
    check_metadata(data[: len(data) - 3 * 16], "video")  # within the walk: nothing to count


def test_an_ogg_file_s_own_comments_are_counted_and_a_real_one_passes():
    from lazymedia import synthetic

    namespace = {"synthetic": synthetic}
    exec(OGG_VORBIS_STREAMS.format(parts=1, entries=MAX_METADATA_ENTRIES), namespace)  # 2000 + the real file's
    with pytest.raises(MediaTooLargeError, match="Vorbis comments"):
        check_metadata(namespace["data"], "audio")
    exec(OGG_VORBIS_STREAMS.format(parts=1, entries=MAX_METADATA_ENTRIES - 10), namespace)
    check_metadata(namespace["data"], "audio")
    check_metadata(synthetic.tone(0.5, fmt="ogg"), "audio")
