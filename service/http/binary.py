"""The Open Inference Protocol's binary tensor data extension, as Triton's clients speak it.

A request or response body is a JSON header followed by raw tensor bytes; the header's length
is in the `Inference-Header-Content-Length` HTTP header, and each binary tensor says its byte
count in `parameters.binary_data_size`, in the order of the tensors. BYTES elements are a 4-byte
little-endian length and the bytes; numbers are raw little-endian values, row-major.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from service.errors import InvalidInput

HEADER_LENGTH = b"inference-header-content-length"  # as ASGI scopes name it: lower case, bytes
# OIP datatypes this service returns or accepts, as `array` type codes (fixed sizes on every platform we run).
_CODES = {"FP32": "f", "FP64": "d", "INT64": "q", "INT32": "i", "INT16": "h", "INT8": "b", "UINT8": "B", "BOOL": "B"}


def is_count(text: str) -> bool:
    """ASCII digits only: `str.isdigit` takes "²", which `int` refuses."""
    return text.strip().isascii() and text.strip().isdigit()


def split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tail of a request body."""
    if header_length is None:
        return body, b""
    if not is_count(header_length) or int(header_length) > len(body):
        raise InvalidInput(f"Inference-Header-Content-Length must be a byte count within the body ({len(body)} bytes)")
    n = int(header_length)
    return body[:n], body[n:]


def take(blob: bytes, offset: int, size: object) -> tuple[bytes, int]:
    """`size` bytes of the binary tail from `offset`; the new offset."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(blob):
        raise InvalidInput(f"binary_data_size must be a byte count within the {len(blob) - offset} bytes left")
    return blob[offset : offset + size], offset + size


def decode_bytes(raw: bytes) -> list[bytes]:
    """BYTES elements: each a 4-byte little-endian length, then that many bytes."""
    out, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidInput("BYTES tensor data ends inside an element length")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise InvalidInput("BYTES tensor data ends inside an element")
        out.append(raw[pos : pos + n])
        pos += n
    return out


def encode(datatype: str, data: Sequence[Any]) -> bytes:
    """A tensor's values as the extension lays them out."""
    if datatype == "BYTES":
        parts = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in data]
        return b"".join(struct.pack("<I", len(p)) + p for p in parts)
    values = array(_CODES[datatype], data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()
