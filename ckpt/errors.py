"""The one family of checkpoint errors. Both trees raise these very classes:
`reference.resume.CheckpointError is torch_impl.resume.CheckpointError is ckpt.CheckpointError`.

    CheckpointError
    ├── CheckpointCorruptError     the bytes are not a checkpoint this code can parse
    ├── CheckpointVersionError     a well-formed checkpoint of another version or payload kind
    ├── CheckpointMismatchError    a valid checkpoint of another configuration or model
    ├── CheckpointUnsafeError      loading it would need pickle (arbitrary code)
    ├── CheckpointDirectoryError   what the directory holds forbids what was asked
    └── CheckpointWriteError       writing failed (also an OSError, with the errno)
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of every error the container, the directory and both trees' loaders raise."""


class CheckpointCorruptError(CheckpointError):
    """Not a checkpoint this code can parse: truncated, bit-flipped, not a regular file, or a
    crafted file whose digest is valid but whose content is out of bounds (a length beyond
    the file, nesting deeper than MAX_DEPTH, a state that is not a dict)."""


class CheckpointVersionError(CheckpointError):
    """A well-formed checkpoint of a format version, or a payload kind, this code cannot read."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint that does not fit what it is loaded into: another configuration
    (the differing fields are named) or another model (the first differing key, both shapes)."""


class CheckpointUnsafeError(CheckpointError):
    """A checkpoint whose payload would need pickle (arbitrary code) to load: refused."""


class CheckpointDirectoryError(CheckpointError):
    """A checkpoint directory whose contents forbid what was asked: a fresh run into a
    directory that holds checkpoints, a resume with nothing it can load, a checkpoint beyond
    the steps asked for, a directory another run holds. Nothing in it was changed."""


class CheckpointWriteError(CheckpointError, OSError):
    """Writing failed (read-only or missing directory, disk full, ...). The message names the
    checkpoint's own path, never a temporary name; the previous file at that path is untouched."""
