"""Checkpoints without a library: the container both trees write, its atomic write, the
directory of a run's checkpoints, and what a run does with what it finds there.

The standard library and `xxhash` only (its XXH3-128 seals the container: NOTE [ Container
digest ] in ckpt/digest.py); no NumPy, no torch, so `reference` and `torch_impl` both
import it and neither borrows from the other. Each tree's resume.py adds only its payload: how a
state becomes bytes and back ("npy-records" in reference/resume.py, "torch-zip" in
torch_impl/resume.py).

    ckpt/errors.py      the one CheckpointError family
    ckpt/container.py   the file layout, verified reading (NOTE [ Checkpoint file layout ]),
                        and the unverified header a directory chooses by
    ckpt/writer.py      writing the container: streamed into an atomic write, or whole
    ckpt/reader.py      ViewReader: the mapped payload read as a file, in place
    ckpt/digest.py      XXH3-128, the container's digest, and version 2's piecewise SHA-256
    ckpt/atomic.py      the hashing writer, the atomic write (NOTE [ Atomic write ]), the
                        writability probe
    ckpt/match.py       does a state fit: check_matches (shapes and dtypes by duck typing),
                        the configuration's differing fields
    ckpt/directory.py   a directory of ckpt-<step>.ckpt (NOTE [ What a run may touch in its
                        directory ])
    ckpt/policy.py      fresh, resume, overwrite, refuse: the training loop's directory policy
                        (NOTE [ Choosing before verifying ])
"""

from ckpt.atomic import HashingWriter, atomic_write, probe
from ckpt.container import (
    FORMAT,
    MAGIC,
    MAX_DEPTH,
    VERSION,
    Container,
    check_depth,
    check_state,
    load_container,
    open_checkpoint,
    read_header,
)
from ckpt.directory import CheckpointDirectory, Entry
from ckpt.errors import (
    CheckpointCorruptError,
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointUnsafeError,
    CheckpointVersionError,
    CheckpointWriteError,
)
from ckpt.match import check_config, check_matches, config_differences, describe
from ckpt.policy import POLICY, Resumed, due, start
from ckpt.reader import ViewReader
from ckpt.writer import encode_container, save_container

__all__ = [
    "FORMAT", "MAGIC", "MAX_DEPTH", "POLICY", "VERSION", "CheckpointCorruptError",
    "CheckpointDirectory", "CheckpointDirectoryError", "CheckpointError",
    "CheckpointMismatchError", "CheckpointUnsafeError", "CheckpointVersionError",
    "CheckpointWriteError", "Container", "Entry", "HashingWriter", "Resumed", "ViewReader",
    "atomic_write", "check_config", "check_depth", "check_matches", "check_state",
    "config_differences", "describe", "due", "encode_container", "load_container",
    "open_checkpoint", "probe", "read_header", "save_container", "start",
]
