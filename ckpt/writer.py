"""Writing the checkpoint container (its layout: ckpt/container.py): streamed through the
hashing writer into an atomic write, or built whole in memory for tests and crafted files."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

from ckpt import digest
from ckpt.atomic import HashingWriter, atomic_write
from ckpt.container import FORMAT, MAGIC, VERSION


def header_bytes(payload: str, writer: str, meta: Mapping[str, Any] | None = None) -> bytes:
    """magic | H | header JSON: the first bytes of a container."""
    fields: dict[str, Any] = {"format": FORMAT, "version": VERSION, "payload": payload,
                              "writer": writer}
    if meta is not None:
        fields["meta"] = dict(meta)
    header = json.dumps(fields, sort_keys=True, allow_nan=False).encode()
    return MAGIC + struct.pack("<I", len(header)) + header


def encode_container(payload_bytes: bytes, payload: str, writer: str,
                     meta: Mapping[str, Any] | None = None) -> bytes:
    """A whole container in memory (for tests and crafted files; saving streams instead)."""
    body = header_bytes(payload, writer, meta) + payload_bytes + struct.pack(
        "<Q", len(payload_bytes))
    return body + digest.digest_of(body)


def write_container(out: HashingWriter, payload: str, writer: str,
                    meta: Mapping[str, Any] | None,
                    write_payload: Callable[[HashingWriter], None]) -> None:
    """Stream a container into `out`: prefix and header, the payload, its length, the digest."""
    start = out.write(header_bytes(payload, writer, meta))
    write_payload(out)
    out.write(struct.pack("<Q", out.size - start))
    out.write(digest.NAME_FIELD)
    out.write(out.hasher.digest())


def save_container(path: str | os.PathLike, payload: str, writer: str,
                   write_payload: Callable[[HashingWriter], None],
                   meta: Mapping[str, Any] | None = None) -> int:
    """Stream a container to `path` atomically (NOTE [ Atomic write ]); return its size."""
    return atomic_write(path, lambda out: write_container(out, payload, writer, meta,
                                                          write_payload))
