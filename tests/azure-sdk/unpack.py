"""Unpacks an ebb envelope (docs/reference/envelope.md, version 1) without ebb.

  unpack.py [FILE]          FILE, or standard input without one or with "-"

The input is the message body: the envelope's bytes, or their base64 (what an Azure queue
holds; line breaks are ignored). Prints one JSON object per item, in order:

  {"attempts": 0, "body_hex": "7b226964..."}
  {"attempts": 2, "claim_check": {"azure_blob": {"account": ..., "container": ..., "blob": ...},
                                  "size": 52428800, "sha256": "..."}}

Exits 1 with the reason on a message that is not an envelope or is a broken one. Needs
only the standard library for codecs none and deflate; zstd needs `zstandard`, lz4 needs
`lz4` (both pinned in requirements.txt), imported only when an envelope uses them.

With the official SDK, a message received by a QueueClient built with
`message_decode_policy=BinaryBase64DecodePolicy()` has the envelope's bytes as its content:
`envelope_items(message.content)`.
"""
import base64
import binascii
import json
import struct
import sys
import zlib

MAGIC = bytes([0xC1, 0x45, 0x42, 0x42, 0x0D, 0x0A, 0x1A, 0x0A])
HEADER = struct.Struct("<8sBBHIII")  # magic, version, codec, flags, count, decoded, stored
CODECS = {0: "none", 1: "deflate", 2: "zstd", 3: "lz4"}
# What ebb's consumers accept by default (payload::Limits).
MAX_ITEMS = 10_000
MAX_DECODED_BYTES = 4 << 20


class NotAnEnvelope(Exception):
    pass


def decompress(codec, stored, declared):
    """The item section, exactly `declared` bytes, never inflating further."""
    if codec == "none":
        return stored
    if codec == "deflate":
        inflate = zlib.decompressobj(-15)  # raw DEFLATE, no zlib header
        section = inflate.decompress(stored, declared + 1)
        if len(section) > declared or inflate.unconsumed_tail:
            raise ValueError(f"decompression bomb: the section inflates past {declared} bytes")
        if not inflate.eof or inflate.unused_data:
            raise ValueError("the deflate stream is cut short or followed by other bytes")
        return section
    if codec == "zstd":
        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(stored) as reader:
            section = b""
            while len(section) <= declared:
                chunk = reader.read(declared + 1 - len(section))
                if not chunk:
                    break
                section += chunk
        if len(section) > declared:
            raise ValueError(f"decompression bomb: the section inflates past {declared} bytes")
        return section
    if codec == "lz4":
        import lz4.block

        # One LZ4 block; its decoded length is the header's, and it may not inflate past it.
        return lz4.block.decompress(stored, uncompressed_size=declared)
    raise ValueError(f"unknown codec {codec}")


def envelope_items(data):
    """The items of the envelope `data` (bytes) as dicts; NotAnEnvelope if it is not one."""
    if not data.startswith(MAGIC):
        raise NotAnEnvelope("no envelope marker: a plain message")
    if len(data) < HEADER.size + 4:
        raise ValueError(f"truncated envelope: {len(data)} bytes")
    _, version, codec, flags, count, declared, stored = HEADER.unpack_from(data)
    if version != 1:
        raise ValueError(f"envelope version {version}: this reader reads version 1")
    if len(data) != HEADER.size + stored + 4:
        raise ValueError(f"envelope of {len(data)} bytes, its header says {HEADER.size + stored + 4}")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise ValueError("corrupted envelope: its CRC32 does not match")
    # Flag 1: one plain message whose body was offloaded (exactly one claim-check item).
    if codec not in CODECS or flags not in (0, 1):
        raise ValueError(f"unknown codec {codec} or flags {flags}")
    if count > MAX_ITEMS or declared > MAX_DECODED_BYTES or count * 9 > declared:
        raise ValueError(f"{count} items in {declared} bytes: over the limits or impossible")
    try:
        section = decompress(CODECS[codec], data[HEADER.size : HEADER.size + stored], declared)
    except ImportError as error:
        raise ValueError(f"codec {CODECS[codec]} needs its package (see requirements.txt): {error}")
    except ValueError:
        raise
    except Exception as error:  # zlib.error, zstandard.ZstdError, lz4.block.LZ4BlockError
        raise ValueError(f"the {CODECS[codec]} section does not decompress: {error}")
    if len(section) != declared:
        raise ValueError(f"the section comes to {len(section)} bytes, its header says {declared}")

    at = 0

    def take(n):
        nonlocal at
        if at + n > len(section):
            raise ValueError(f"item runs {at + n - len(section)} bytes past the end of the section")
        at += n
        return section[at - n : at]

    def text(length_format):
        (length,) = struct.unpack(length_format, take(struct.calcsize(length_format)))
        return take(length).decode("utf-8")

    items = []
    for _ in range(count):
        kind, attempts = struct.unpack("<BI", take(5))
        origin = None
        if kind & 0x80:
            # Put back after failing: the message id and index its producer got.
            message_id = text("<B")
            (index,) = struct.unpack("<I", take(4))
            origin = {"message_id": message_id, "index": index}
        trace = None
        if kind & 0x40:
            # The producer's W3C trace context.
            traceparent = text("<B")
            trace = {"traceparent": traceparent, "tracestate": text("<H") or None}
        kind &= 0x3F
        if kind == 0:
            (length,) = struct.unpack("<I", take(4))
            items.append({"attempts": attempts, "body": take(length)})
        elif kind == 1:
            size, sha256, location = struct.unpack("<Q32sB", take(41))
            if location == 1:
                where = {"azure_blob": {"account": text("<B"), "container": text("<B"), "blob": text("<H")}}
            elif location == 2:
                queue = text("<B")
                (key,) = struct.unpack("<Q", take(8))
                where = {"embedded_body": {"queue": queue, "key": key}}
            else:
                raise ValueError(f"unknown claim-check location {location}")
            items.append({"attempts": attempts, "claim_check": dict(where, size=size, sha256=sha256.hex())})
        else:
            raise ValueError(f"unknown item kind {kind}")
        if origin:
            items[-1]["origin"] = origin
        if trace:
            items[-1]["trace"] = trace
    if at != len(section):
        raise ValueError(f"{len(section) - at} bytes after the last of {count} items")
    return items


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "-"
    data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    if not data.startswith(MAGIC):
        try:
            data = base64.b64decode(b"".join(data.split()), validate=True)
        except binascii.Error:
            pass  # neither raw nor base64: reported as not an envelope below
    try:
        items = envelope_items(data)
    except (NotAnEnvelope, ValueError) as error:
        sys.exit(f"unpack.py: {error}")
    for item in items:
        if "body" in item:
            item["body_hex"] = item.pop("body").hex()
        print(json.dumps(item))


if __name__ == "__main__":
    main()
