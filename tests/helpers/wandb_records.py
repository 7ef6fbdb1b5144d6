"""Read a W&B offline run's ``.wandb`` file: W&B's transaction log (LevelDB's log format: 32 KiB
blocks of CRC-checked chunks after a 7-byte file header) of ``wandb.proto`` ``Record``s."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from wandb.proto import wandb_internal_pb2

FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version 0
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every record of the ``.wandb`` file at ``path``, in order; a torn or corrupt chunk
    raises ``ValueError``."""
    data = Path(path).read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is not a W&B transaction log")
    records, pending, offset = [], b"", FILE_HEADER.size
    while offset < len(data):
        if BLOCK - offset % BLOCK < CHUNK_HEADER.size:  # the block's zero padding
            offset += BLOCK - offset % BLOCK
            continue
        if offset + CHUNK_HEADER.size > len(data):
            raise ValueError(f"{path} ends inside a chunk header")
        crc, length, kind = CHUNK_HEADER.unpack_from(data, offset)
        payload = data[offset + CHUNK_HEADER.size : offset + CHUNK_HEADER.size + length]
        if len(payload) != length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"{path}: torn or corrupt chunk at byte {offset}")
        offset += CHUNK_HEADER.size + length
        pending += payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    if pending:
        raise ValueError(f"{path} ends inside a record")
    return records
