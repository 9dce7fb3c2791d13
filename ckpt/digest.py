"""The container's digest: XXH3-128 (the `xxhash` package), and the piecewise SHA-256 that
version-2 files carry, kept so that they still load and verify.

NOTE [ Container digest ]
The digest that seals a checkpoint is integrity, not authenticity. It sits in the same file
as the bytes it covers, so whoever can rewrite the file can rewrite the digest too: a
cryptographic hash buys nothing against such a person, and loaders bound-check every byte
anyway (NOTE [ No pickle on load ] in reference/resume.py). What the digest is for is
accidental damage: a torn write, a flipped bit, a truncated copy, a foreign file. Against
those a 128-bit hash with full avalanche misses a random change with probability 2^-128,
as SHA-256 truncated to 128 bits would. XXH3-128 is such a hash (it passes SMHasher's
avalanche and collision tests) and runs at about 22 GiB/s per core here, against SHA-256's
1.6 GiB/s: with SHA-256 a verified load or save cost up to 3x a plain one, because the hash
was slower than reading or writing the bytes (docs/resume.md, "Cost of a safe checkpoint").
Who needs authenticity signs the file, or keeps its SHA-256 elsewhere (`sha256sum
ckpt-00000012.ckpt > ckpt-00000012.ckpt.sha256`, checked with `sha256sum -c`).
The state digests the CLI prints (`state-sha256:`, reference/state_digest.py) are another
matter: they identify a training state across runs and trees, and stay SHA-256.

NOTE [ Piecewise digest ] (version-2 files; read, never written)
    digest(b) = SHA-256( SHA-256(p_0) || SHA-256(p_1) || ... || SHA-256(p_{k-1}) )
where p_0, p_1, ... are b cut into PIECE-byte pieces (the last one shorter; an empty b is
one empty piece). Version 2 hashed the pieces on helper threads to hide SHA-256's speed;
reading such a file now hashes them one after another, which is slower but rare.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import xxhash

NAME = "xxh3-128"  # what a version-3 seal names (ckpt/container.py)
NAME_FIELD = NAME.encode("ascii").ljust(16, b"\0")  # the seal's first 16 bytes
DIGEST_BYTES = 16  # the seal's last 16 bytes
PIECE = 1 << 20  # version 2's piece size
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def new() -> xxhash.xxh3_128:
    """A streaming XXH3-128 (update(bytes-like), digest() -> 16 bytes)."""
    return xxhash.xxh3_128()


def in_background(fn: Callable[..., object], *args: object) -> Future:
    """Run fn(*args) on the one helper thread (xxhash releases the GIL while it hashes);
    return once the helper has started, not merely been handed, the work.

    A woken helper needs the GIL before it can call into xxhash, and a caller busy in
    Python code (an unpickler, a record parser) hands the GIL over only when it blocks or
    after sys.getswitchinterval() (5 ms): without the wait, the digest of a checkpoint that
    decodes in under 5 ms would start only when the caller asks for its result, and overlap
    nothing. Waiting on `started` releases the GIL to the helper, which sets it and enters
    xxhash, releasing the GIL again; the wait costs one thread wake-up (tens of
    microseconds), which is why small files are hashed inline instead (container.py,
    INLINE_DIGEST)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-digest")
    started = threading.Event()

    def run() -> object:
        started.set()
        return fn(*args)

    future = _pool.submit(run)
    try:
        started.wait()
    except BaseException:  # an interrupt: the caller must not free what the helper reads
        wait([future])
        raise
    return future


def xxh3_128(data: bytes | memoryview) -> bytes:
    """The XXH3-128 digest of bytes in memory (or mapped), 16 bytes big-endian."""
    return xxhash.xxh3_128_digest(data)


def digest_of(body: bytes | memoryview) -> bytes:
    """The 32-byte seal of a version-3 container whose bytes before it are `body` (the
    frame, up to the payload's length): the digest's name, then XXH3-128 of body + name."""
    hasher = new()
    hasher.update(body)
    hasher.update(NAME_FIELD)
    return NAME_FIELD + hasher.digest()


def sha256_piecewise(data: bytes | memoryview) -> bytes:
    """NOTE [ Piecewise digest ] of bytes in memory (or mapped): version 2's seal."""
    view = memoryview(data).cast("B")
    leaves = [hashlib.sha256(view[i:i + PIECE]).digest()
              for i in range(0, len(view), PIECE)] or [hashlib.sha256(b"").digest()]
    return hashlib.sha256(b"".join(leaves)).digest()
