"""The FFmpeg packet loop that the audio and video codecs share."""

from __future__ import annotations

from collections.abc import Iterator

import av


class DecodedFrames:
    """The frames a stream's decoder presents from here on, packet by packet: a packet it cannot
    decode is stepped over, as FFmpeg's own tools do, and so is a container that breaks off
    (what the decoder holds is then flushed). `skipped` counts both."""

    def __init__(self, container: av.container.InputContainer, stream: av.stream.Stream):
        self.skipped = 0
        self._frames = self._decode(container, stream)

    def __iter__(self) -> Iterator[av.frame.Frame]:
        return self._frames

    def _decode(self, container: av.container.InputContainer, stream: av.stream.Stream) -> Iterator[av.frame.Frame]:
        context = stream.codec_context
        packets = container.demux(stream)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                packet = None
            except av.error.FFmpegError:
                self.skipped += 1
                packet = None  # the container broke off: flush what the decoder holds
            try:
                yield from context.decode(packet)
            except av.error.FFmpegError:
                self.skipped += 1  # a damaged packet
            if packet is None:
                return
