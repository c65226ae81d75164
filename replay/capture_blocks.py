"""The blocks of a capture file: whole ones are read, a torn last one ends the capture, and any
other that cannot be read is corrupt (docs/replay.md, "The capture file")."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Generic, TypeVar

from codeclog.replay.errors import CaptureFormatError

SYNC_SIZE = 16
CODECS = ("deflate", "null")
_SEARCH_CHUNK = 1 << 20
T = TypeVar("T")


class CorruptBlockError(CaptureFormatError):
    """A block in the capture cannot be read and is not a torn last block."""

    def __init__(self, number: int, offset: int, reason: str) -> None:
        super().__init__(
            f"block #{number} (at byte {offset}) is corrupt: {reason}; the capture is damaged "
            "(--skip-corrupt-blocks reads past such blocks and counts them)"
        )
        self.number = number
        self.offset = offset


@dataclasses.dataclass(frozen=True, slots=True)
class SkippedBlock:
    """A corrupt block skipped on request: up to the next sync marker (or the file's end)."""

    number: int  # in file order, from 1
    offset: int  # its first byte in the file
    size: int  # bytes skipped
    reason: str

    def describe(self) -> str:
        return f"block #{self.number} at byte {self.offset} ({self.size:,} bytes): {self.reason}"


class _Torn(Exception):
    """The file ends inside this block."""


class _Corrupt(Exception):
    """This block cannot be read."""


class BlockReader(Generic[T]):
    """The blocks of a capture after its header, each passed through `decode(data, count)`
    (the inflated bytes and the record count; it raises ValueError when the records do not
    fill the bytes). `fo` is seekable and positioned at the first block."""

    def __init__(
        self,
        fo: IO[bytes],
        sync: bytes,
        codec: str,
        decode: Callable[[bytes, int], T],
        skip_corrupt: bool = False,
    ) -> None:
        self._fo = fo
        self._sync = sync
        self._codec = codec
        self._decode = decode
        self._skip_corrupt = skip_corrupt
        self._start = fo.tell()
        self._size = fo.seek(0, 2)
        self.truncated = False  # the last block was torn (a capture cut short)
        self.skipped: list[SkippedBlock] = []

    def __iter__(self) -> Iterator[T]:
        offset, number = self._start, 1
        while offset < self._size:
            try:
                offset, value = self._block(offset)
            except _Torn as torn:
                if self._sync_after(offset) is None:
                    self.truncated = True
                    return
                offset = self._corrupt(number, offset, str(torn))
            except _Corrupt as corrupt:
                offset = self._corrupt(number, offset, str(corrupt))
            else:
                yield value
            number += 1

    def _corrupt(self, number: int, offset: int, reason: str) -> int:
        """Raise, or note the block as skipped and return where reading resumes."""
        if not self._skip_corrupt:
            raise CorruptBlockError(number, offset, reason)
        resume = self._sync_after(offset) or self._size
        self.skipped.append(SkippedBlock(number, offset, resume - offset, reason))
        return resume

    def _block(self, offset: int) -> tuple[int, T]:
        """(where the next block starts, the decoded block at `offset`)."""
        fo = self._fo
        fo.seek(offset)
        count, size = _varint(fo), _varint(fo)
        if count < 0 or size < 0:
            raise _Corrupt(f"a negative {'record count' if count < 0 else 'size'}")
        start = fo.tell()
        end = start + size + SYNC_SIZE
        if end > self._size:
            raise _Torn(f"its size ({size:,} bytes) runs past the end of the file")
        payload = fo.read(size)
        if fo.read(SYNC_SIZE) != self._sync:
            raise _Corrupt("its sync marker is wrong")
        data = self._inflate(payload)
        if count > len(data):
            raise _Corrupt(f"it claims {count:,} records in {len(data):,} bytes")
        try:
            return end, self._decode(data, count)
        except ValueError as exc:
            raise _Corrupt(f"its records do not decode ({exc})") from None

    def _inflate(self, payload: bytes) -> bytes:
        if self._codec == "null":
            return payload
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(payload)
        except zlib.error as exc:
            raise _Corrupt(f"it does not inflate ({exc})") from None
        if not inflater.eof:
            raise _Corrupt("its deflate stream stops short")
        trailer = inflater.unused_data
        if trailer and zlib.adler32(data).to_bytes(4, "big")[: len(trailer)] != trailer:
            raise _Corrupt("its checksum does not match its contents")
        return data

    def _sync_after(self, offset: int) -> int | None:
        """Where the first sync marker at or after `offset` ends; None if there is none."""
        fo = self._fo
        fo.seek(offset)
        carried = b""
        position = offset
        while chunk := fo.read(_SEARCH_CHUNK):
            window = carried + chunk
            found = window.find(self._sync)
            if found >= 0:
                return position - len(carried) + found + SYNC_SIZE
            carried = window[-(SYNC_SIZE - 1) :]
            position += len(chunk)
        return None


def _varint(fo: IO[bytes]) -> int:
    """An Avro long (zigzag varint); _Torn when the file ends inside it."""
    shift = 0
    accumulated = 0
    while True:
        byte = fo.read(1)
        if not byte:
            raise _Torn("the file ends inside its count or size")
        value = byte[0]
        accumulated |= (value & 0x7F) << shift
        if not value & 0x80:
            return (accumulated >> 1) ^ -(accumulated & 1)
        shift += 7
        if shift > 63:
            raise _Corrupt("its count or size is not a valid number")
