"""The checkpoint file: one container for both trees, which differ only in the payload.

    offset      bytes  content
    0           8      magic  b"\\x89MTCKP3\\n"
    8           4      H = header length, uint32 little-endian, H <= MAX_HEADER
    12          H      header, UTF-8 JSON object: {"format": "mirrortrain-checkpoint",
                       "version": 3, "payload": kind, "writer": tree, "meta": {...}}
    12 + H      P      payload: "npy-records" (reference/resume.py) or "torch-zip"
                       (torch_impl/resume.py)
    12 + H + P  8      P, uint64 little-endian (known only once the payload is written)
    20 + H + P  16     the digest's name, ASCII, NUL-padded: b"xxh3-128"
    36 + H + P  16     XXH3-128 of every byte before it (NOTE [ Container digest ] in
                       ckpt/digest.py)

Version 2 (read, no longer written) differs in the magic (b"\\x89MTCKPT\\n") and in its last
32 bytes: a piecewise SHA-256 of every byte before them (NOTE [ Piecewise digest ]).

`meta` (optional) is what the directory needs to know without decoding the payload: a
training checkpoint's {"step": s, "config": {...}} (ckpt/directory.py).

Reading (`open_checkpoint`): only a regular file is opened, never a FIFO or a device
(O_NONBLOCK, then fstat); the prefix and the trailer must add up to the file's size
(12 + H + P + 40) before the body is read; the file is mapped, not read into memory, and
the digest is verified over the mapping before the header or the payload is trusted. So a
truncation or a flipped bit anywhere is a CheckpointCorruptError (unnoticed with
probability 2^-128), and a huge file (garbage, or a checkpoint extended or cut) is refused
after reading 52 bytes, not read into memory. `read_header` reads only the frame and the
header (no digest): what a directory chooses by, never what it trusts.

Writing the container is ckpt/writer.py.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

from ckpt import digest
from ckpt.errors import CheckpointCorruptError, CheckpointVersionError

MAGIC = b"\x89MTCKP3\n"  # version 3: the seal names its digest (XXH3-128)
MAGIC_V2 = b"\x89MTCKPT\n"  # version 2: the seal is a piecewise SHA-256 (read only)
FORMAT = "mirrortrain-checkpoint"
VERSION = 3
PREFIX = len(MAGIC) + 4  # magic and the header length
SEAL = 32  # every version: the last 32 bytes (v3: the digest's name and the digest)
TRAILER = 8 + SEAL  # the payload length and the seal
MAX_HEADER = 1 << 20  # a header is a few hundred bytes; more is a crafted length
MAX_DEPTH = 32  # a training state nests about 6 deep; more is a crafted file
INLINE_DIGEST = 16 << 20  # smaller: decode, then hash (NOTE [ Verify while decoding ])

# NOTE [ Checkpoint file layout ]
# Both trees write this container and differ only in the payload. The digest covers the
# header too, so a flip that happens to turn "version": 3 into another valid number is
# "corrupt", not "another version". For that, which digest seals a file must be known
# BEFORE the header is read: the frame magic | H | header | ... | P | seal is the same in
# every version, 12 bytes in front and 40 behind, so the lengths are checked before
# anything else, and the 52 bytes read for that name the digest: the magic names the
# seal's layout (version 2: 32 bytes of piecewise SHA-256; version 3: a 16-byte digest
# name, then the digest of every byte before it, the name included) and a version-3
# seal names its algorithm. A digest name this code does not know cannot be verified, so
# the file is CheckpointCorruptError naming it (written by a newer mirrortrain, or a
# flipped byte), never "verified" (the directory never deletes it as its own). A header's
# version must be its frame's (2 in a version-2 frame, 3 in a version-3 one): a version-2
# reader never takes a version-3 header's word. The payload's length follows the payload
# because a streamed payload's length is known only at its end; the digest covers it too.
# torch.load alone would not notice damage: it does not verify the CRC-32s of its zip
# members, so a flipped byte inside a tensor loads silently with another value
# (tests/test_resume_torch.py shows it). The digest is integrity, not authenticity: a
# crafted file carries a valid one, so payloads are ALSO parsed without pickle and within
# bounds (NOTE [ No pickle on load ] in reference/resume.py).

# NOTE [ Verify while decoding ]
# Loading a checkpoint costs a digest of every byte and a decode that copies every byte;
# both release the GIL, so load_container hashes on one helper thread while it decodes
# (XXH3 at ~22 GiB/s finishes well before the decode's copy, ~8 GiB/s). Decoding bytes
# whose digest is not yet known adds nothing an attacker lacks (a crafted file carries a
# valid digest, so every decoder is bounded for ANY bytes: lengths checked against the
# bytes present, nesting limited); what it must not do is let damage masquerade as
# something else, so when the digest fails, the decoded state is dropped and the error is
# "corrupt", whatever the decoder said. open_checkpoint, which only reads the header,
# verifies first. Below INLINE_DIGEST bytes load_container hashes on its own thread after
# the decode (the same order of trust, one thread): the hand-off to the helper (two thread
# wake-ups and a GIL hand-over, digest.in_background) costs more than overlapping a small
# file's hash saves; measured, one thread wins up to 16 MiB and the overlap from 32-64 MiB
# (docs/resume.md).


# ---------------------------------------------------------------- reading


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, where: str, *, follow_symlinks: bool = True) -> int:
    """A read-only descriptor of `path`, refusing anything but a regular file.

    O_NONBLOCK keeps a FIFO from blocking the open; fstat then refuses it before any read.
    A missing file stays FileNotFoundError.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CheckpointCorruptError(f"{where}: cannot open: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointCorruptError(f"{where}: {_kind(mode)}, not a regular file")
    return fd


class Container:
    """A verified container: `header` (a dict) and `payload` (a read-only memoryview of the
    mapped file). Use as a context manager; the payload is valid until close()."""

    def __init__(self, header: dict[str, Any], view: memoryview, payload: memoryview,
                 closer: Callable[[], None]) -> None:
        self.header, self.payload = header, payload
        self._view, self._closer = view, closer

    def close(self) -> None:
        self.payload.release()
        self._view.release()
        self._closer()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map(fd: int, size: int) -> tuple[memoryview, Callable[[], None]]:
    """The file's bytes without reading them into memory (a read when mapping is refused)."""
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        buf = bytearray(size)
        view, done = memoryview(buf), 0
        while done < size:
            n = os.preadv(fd, [view[done:]], done)
            if n == 0:
                break
            done += n
        return memoryview(buf)[:done], lambda: None

    def close() -> None:
        try:
            mapped.close()
        except BufferError:  # a caller still holds a view of it: it closes when collected
            pass

    return memoryview(mapped), close


class Frame(NamedTuple):
    """What the first 12 and last 40 bytes say: the format version, the digest's name, how
    many of the last bytes are the digest and what computes it over every byte before."""

    version: int
    digest: str
    digest_bytes: int
    compute: Callable[[memoryview], bytes]


def _printable(raw: bytes) -> str:
    text = raw.rstrip(b"\0")
    return repr(text.decode()) if text.isascii() and text.decode().isprintable() else repr(raw)


def frame_of(magic: bytes, seal: bytes, where: str) -> Frame:
    """The frame a magic and a seal name (NOTE [ Checkpoint file layout ]), before any
    digest is computed; CheckpointCorruptError for a digest this code cannot verify."""
    if magic == MAGIC_V2:
        return Frame(2, "piecewise SHA-256", SEAL, lambda v: digest.sha256_piecewise(v))
    name = seal[:SEAL - digest.DIGEST_BYTES]
    if name != digest.NAME_FIELD:
        raise CheckpointCorruptError(
            f"{where}: sealed with digest {_printable(name)}, which this code cannot verify "
            f"(it knows {digest.NAME!r}, and version 2's piecewise SHA-256): written by a "
            "newer mirrortrain, or damaged")
    return Frame(VERSION, "XXH3-128", digest.DIGEST_BYTES, lambda v: digest.xxh3_128(v))


def _frame(fd: int, where: str) -> tuple[int, int, Frame]:
    """(size, H, frame) of an open file after the length checks (module docstring): 52 bytes
    read, whatever the file's size."""
    size = os.fstat(fd).st_size
    if size < PREFIX + TRAILER:
        raise CheckpointCorruptError(f"{where}: {size} bytes is shorter than the smallest "
                                     f"checkpoint ({PREFIX + TRAILER}): truncated")
    prefix = os.pread(fd, PREFIX, 0)
    magic = prefix[: len(MAGIC)]
    if magic not in (MAGIC, MAGIC_V2):
        raise CheckpointCorruptError(f"{where}: not a mirrortrain checkpoint (bad magic)")
    (header_len,) = struct.unpack("<I", prefix[len(MAGIC):])
    trailer = os.pread(fd, TRAILER, size - TRAILER)
    (payload_len,) = struct.unpack("<Q", trailer[:8])
    if header_len > MAX_HEADER or PREFIX + header_len + payload_len + TRAILER != size:
        raise CheckpointCorruptError(
            f"{where}: its lengths (header {header_len}, payload {payload_len}) do not add "
            f"up to its {size} bytes: truncated, extended or corrupted")
    return size, header_len, frame_of(magic, trailer[8:], where)


def _mapped(path: str | os.PathLike, where: str, follow_symlinks: bool
            ) -> tuple[memoryview, Callable[[], None], int, Frame]:
    """(the file's bytes, their closer, H, its frame) after the length checks (module
    docstring)."""
    fd = open_regular(path, where, follow_symlinks=follow_symlinks)
    try:
        size, header_len, frame = _frame(fd, where)
        view, closer = _map(fd, size)
    finally:
        os.close(fd)
    if len(view) != size:
        view.release()
        closer()
        raise CheckpointCorruptError(f"{where}: changed size while it was read")
    return view, closer, header_len, frame


def read_header(path: str | os.PathLike, *, follow_symlinks: bool = True) -> dict[str, Any]:
    """The header of a container, NOT verified: the length checks and the header's parse,
    the header's bytes and 52 more read, no digest computed. What it says is a claim until
    the file verifies (open_checkpoint, load_container): a flipped bit in the header may
    read as another configuration or version. The directory policy chooses by it and
    verifies what it acts on (NOTE [ Choosing before verifying ] in ckpt/policy.py)."""
    where = os.fspath(path)
    fd = open_regular(path, where, follow_symlinks=follow_symlinks)
    try:
        _, header_len, frame = _frame(fd, where)
        raw = os.pread(fd, header_len, PREFIX)
    finally:
        os.close(fd)
    if len(raw) != header_len:
        raise CheckpointCorruptError(f"{where}: changed size while it was read")
    return parse_header(raw, where, frame.version)


def _digest_matches(frame: Frame, view: memoryview, computed: bytes) -> bool:
    return computed == view[-frame.digest_bytes:]


def _digest_error(where: str, frame: Frame) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{where}: the {frame.digest} of the content does not match "
                                  "the stored digest: truncated or corrupted")


def open_checkpoint(path: str | os.PathLike, *, follow_symlinks: bool = True) -> Container:
    """Open, bound-check and verify a container (module docstring); CheckpointCorruptError or
    CheckpointVersionError naming the path if it is not one this code reads."""
    where = os.fspath(path)
    view, closer, header_len, frame = _mapped(path, where, follow_symlinks)
    try:
        with view[:-frame.digest_bytes] as covered:
            computed = frame.compute(covered)
        if not _digest_matches(frame, view, computed):
            raise _digest_error(where, frame)
        header = parse_header(bytes(view[PREFIX:PREFIX + header_len]), where, frame.version)
    except BaseException:
        view.release()
        closer()
        raise
    return Container(header, view, view[PREFIX + header_len:-TRAILER], closer)


def parse_header(raw: bytes, where: str, version: int = VERSION) -> dict[str, Any]:
    """The header of a container of frame `version` (verified, but for read_header); the
    header's version is checked after the digest, and must be its frame's."""
    frame_version = version
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointCorruptError(f"{where}: unreadable header: {type(e).__name__}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{where}: the header is not a {FORMAT} header")
    version = header.get("version")
    if version != frame_version:
        newer = isinstance(version, int) and version > VERSION
        raise CheckpointVersionError(
            f"{where}: format version {version!r} in a version-{frame_version} frame"
            f"{' (written by a newer mirrortrain)' if newer else ''}; this code reads "
            f"version {VERSION}, and version 2 in its own frame")
    if not (isinstance(header.get("payload"), str) and isinstance(header.get("writer"), str)
            and isinstance(header.get("meta", {}), dict)):
        raise CheckpointCorruptError(f"{where}: the header's payload, writer or meta has the "
                                     "wrong type")
    check_depth(header, where)
    return header


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """CheckpointCorruptError if dicts, lists and tuples nest deeper than `limit`."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = (node.values() if isinstance(node, Mapping)
                    else node if isinstance(node, list | tuple) else ())
        for child in children:
            if isinstance(child, Mapping | list | tuple):
                if depth + 1 > limit:
                    raise CheckpointCorruptError(f"{where}: nested deeper than {limit} levels")
                stack.append((child, depth + 1))


def check_state(state: Any, where: str) -> dict[str, Any]:
    """A decoded state must be a dict nested at most MAX_DEPTH deep."""
    if not isinstance(state, dict):
        raise CheckpointCorruptError(f"{where}: the payload is a {type(state).__name__}, "
                                     "not a dict")
    check_depth(state, where)
    return state


# ---------------------------------------------------------------- what each tree calls


def load_container(path: str | os.PathLike, payload: str,
                   decode: Callable[[memoryview, str], Any], hint: str
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, state): a verified container of this payload kind, decoded by `decode` and
    bound-checked (check_state). Another payload kind is a CheckpointVersionError with
    `hint` (how to convert it).

    The digest is computed on the helper thread WHILE the header is parsed and the payload
    decoded (NOTE [ Verify while decoding ]), or on this thread after them for a file under
    INLINE_DIGEST bytes; whatever happens, it is computed and compared; if it does not
    match, the decoded state is dropped and the only error is the digest's.
    """
    where = os.fspath(path)
    view, closer, header_len, frame = _mapped(path, where, follow_symlinks=True)
    covered = view[:-frame.digest_bytes]
    try:
        if len(covered) < INLINE_DIGEST:  # hashed on this thread once decoded
            computed: Callable[[], bytes] = partial(frame.compute, covered)
        else:
            computed = digest.in_background(frame.compute, covered).result  # waits for it

        def digest_matches() -> bool:
            return _digest_matches(frame, view, computed())

        try:
            header = parse_header(bytes(view[PREFIX:PREFIX + header_len]), where,
                                  frame.version)
            if header["payload"] != payload:
                raise CheckpointVersionError(
                    f"{where}: payload {header['payload']!r} written by {header['writer']!r}; "
                    f"this loader reads {payload!r} ({hint})")
            body = view[PREFIX + header_len:-TRAILER]
            try:
                state = decode(body, where)
            finally:
                body.release()
        except BaseException as e:
            if not digest_matches():
                raise _digest_error(where, frame) from e
            raise
        if not digest_matches():
            raise _digest_error(where, frame)
    finally:
        covered.release()
        view.release()
        closer()
    return header, check_state(state, where)
