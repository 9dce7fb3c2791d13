"""What a training run does with what it finds in its checkpoint directory: the one policy
both trees' train() follow (it does not depend on the library).

`start(...)` decides, before a step is trained, where the run begins: at step 0, or from
one checkpoint (loaded by the caller's `load`, which converts another tree's payload if it
can), or not at all (a CheckpointError with a one-line reason, and nothing in the directory
changed). `due(...)` says after which steps a checkpoint is written. POLICY is the same
rules as a table (docs/resume.md prints it); each row names the test that holds the code to
it.

NOTE [ Choosing before verifying ]
A resume reads the directory once, under its lock: each entry's frame and header (the
lengths checked, the header parsed: a few hundred bytes, no digest; container.read_header).
The newest checkpoint is chosen by its header and verified once, by the load that reads it
(the load's own digest check), so its bytes are hashed once, not once per look. An
unverified header is a claim, never a reason to act:
  1. before a refusal that rests on the chosen entry's header (another version,
     configuration or model, beyond --steps, whatever the caller's `config` refuses), the
     entry is verified; one that does not verify is an unreadable entry like any other;
  2. a load whose digest does not match makes the entry unreadable too, and the next older
     checkpoint is chosen, exactly as if every file had been verified first;
  3. unreadable entries are reported ("skipped NAME: why") once the choice is made (or
     refused), oldest first, with what a verified read says of them;
  4. the older checkpoints of this run that the resume owns (ckpt/directory.py) are
     verified before `keep` counts one or it is deleted; one that does not verify is kept
     and reported. A damaged older checkpoint is therefore reported when pruning reaches
     it, not at the start.
A fresh run and --overwrite verify every entry at the start: the summary a refusal prints
and what --overwrite deletes rest on verified files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

from ckpt.directory import CheckpointDirectory, Entry, read_entry
from ckpt.errors import CheckpointCorruptError, CheckpointDirectoryError, CheckpointMismatchError
from ckpt.match import config_differences

Configure = Callable[[Mapping[str, Any] | None], Mapping[str, Any]]

POLICY: tuple[tuple[str, str, str], ...] = (
    # (what the run finds, what it does, the test: tests/test_resume_policy.py)
    ("no entry under a checkpoint name (with or without `--resume`)",
     "starts at step 0; with `--resume` it says there was nothing to resume",
     "test_resume_with_nothing_to_resume_says_so_and_starts_at_step_0"),
    ("no entry under a checkpoint name, and `--resume-strict`",
     "refuses (exit 2): nothing to resume; a directory it created is removed again",
     "test_strict_resume_with_nothing_to_resume_is_refused_leaving_no_directory"),
    ("entries, and neither `--resume` nor `--overwrite`",
     "refuses (exit 2) naming what is there; nothing is changed",
     "test_a_fresh_run_into_a_directory_with_checkpoints_is_refused"),
    ("entries, and `--overwrite`",
     "deletes the checkpoints it can read (any implementation or configuration), naming "
     "each; keeps and reports what it cannot read; starts at step 0",
     "test_overwrite_removes_only_readable_checkpoints_and_says_so"),
    ("`--resume`, the newest readable checkpoint is this implementation's, same config",
     "continues from it; unreadable entries (corrupt, symlink, FIFO, directory, ...) are "
     "reported and skipped, never opened as files or deleted",
     "test_odd_entries_are_reported_and_skipped_and_valid_checkpoints_resume"),
    ("`--resume`, the newest checkpoint's header reads but the file does not verify",
     "reports and skips it as it would a torn file, and continues from the next older; a "
     "refusal never rests on a header that does not verify",
     "test_a_newest_checkpoint_that_does_not_verify_is_skipped_for_the_older_one"),
    ("`--resume`, the newest readable checkpoint is the other implementation's",
     "continues from it through the state mapping and says so (`python -m parity train`); "
     "refused where no converter is given",
     "test_resume_continues_from_the_other_implementation_through_the_mapping"),
    ("`--resume`, the newest readable checkpoint has another configuration",
     "refuses naming each differing field (`precision: 'fp32' in the checkpoint, 'bf16' now`)",
     "test_a_changed_configuration_is_refused_naming_the_fields"),
    ("`--resume`, the newest checkpoint is of another format version",
     "refuses naming the version",
     "test_a_newer_format_version_is_refused_not_skipped"),
    ("`--resume`, the newest readable checkpoint is beyond `--steps`",
     "refuses: the run already went further",
     "test_a_checkpoint_beyond_the_steps_asked_for_is_refused"),
    ("`--resume`, entries but none readable",
     "refuses, naming why the newest cannot be read",
     "test_resume_with_only_unreadable_entries_is_refused"),
    ("`--resume` and `--overwrite` together", "refuses: they contradict",
     "test_resume_and_overwrite_together_are_refused"),
    ("an unreadable entry at the name of a checkpoint the run writes",
     "renames it to `<name>.unreadable` and says so; never overwrites it",
     "test_an_unreadable_entry_at_a_name_the_run_writes_is_renamed_aside"),
    ("after each checkpoint is written",
     "deletes the checkpoints it owns (wrote, or found at the start as its own) beyond the "
     "newest `--keep`; nothing else counts or is deleted",
     "test_pruning_counts_and_deletes_only_owned_checkpoints"),
    ("an owned checkpoint found at the start, when pruning reaches it",
     "verifies it before it counts or is deleted; one that does not verify is kept and "
     "reported, and holds no slot",
     "test_an_owned_checkpoint_that_does_not_verify_is_kept_not_pruned"),
    ("another run holds the directory", "refuses",
     "test_a_second_run_on_a_locked_directory_is_refused"),
    ("the directory cannot be created or written", "refuses before the first step, naming it",
     "test_an_unwritable_directory_is_refused_before_training"),
)


def due(step: int, steps: int, every: int) -> bool:
    """Whether the checkpoint of `step` is written: every `every` steps (0: never between)
    and always the last one, `steps`."""
    return step == steps or (every > 0 and step % every == 0)


def _summary(entries: list[Entry]) -> str:
    readable = [e for e in entries if e.header is not None]
    parts = []
    if readable:
        steps = sorted({e.step for e in readable})
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        parts.append(f"{len(readable)} checkpoint{'s' * (len(readable) != 1)} ({span})")
    unreadable = len(entries) - len(readable)
    if unreadable:
        parts.append(f"{unreadable} entr{'ies' if unreadable != 1 else 'y'} under checkpoint "
                     "names it cannot read")
    return " and ".join(parts)


class Resumed(NamedTuple):
    """The checkpoint a run continues from and its state, as `load` returned it."""

    entry: Entry
    state: Any


def start(directory: CheckpointDirectory, *, config: Mapping[str, Any] | Configure,
          steps: int, resume: bool, overwrite: bool, readable: Collection[str],
          load: Callable[[Entry], Any], strict: bool = False) -> Resumed | None:
    """The checkpoint to continue from, loaded, or None for step 0 (POLICY, module
    docstring).

    `config`: the run's configuration, or how it follows from the configuration saved in
    the checkpoint it would continue (None: there is none); a resume calls it with the
    chosen checkpoint's, and it may refuse by raising. `readable`: the payload kinds `load`
    reads (its own, and those it converts); `load(entry)` returns the state, verifying the
    file (a CheckpointCorruptError when it does not). `strict`: with `resume`, a
    directory without entries is a refusal, not a start at step 0. Checkpoints of this payload and
    configuration become owned (prunable, once verified: NOTE [ Choosing before verifying ]).
    """
    where = directory.directory
    if resume and overwrite:
        raise CheckpointDirectoryError("--resume continues the run in a directory and "
                                       "--overwrite starts a new one there: choose one")
    settle: Configure = config if callable(config) else lambda saved: config
    entries = directory.scan(verify=not resume)
    if not entries:
        if resume and strict:
            raise CheckpointDirectoryError(
                f"nothing to resume in {where}: it holds no checkpoint (--resume-strict; "
                "--resume starts at step 0 there)")
        if resume:
            settle(None)
            directory.say(f"nothing to resume in {where}: starting at step 0")
        return None
    if not resume:
        if not overwrite:
            raise CheckpointDirectoryError(
                f"{where} already holds {_summary(entries)}: pass --resume to continue, "
                "--overwrite to delete its checkpoints first, or choose another directory; "
                "nothing was changed")
        for e in entries:
            if e.header is None:
                directory.say(f"kept {e.name}: cannot read it ({e.problem})")
            elif directory.remove(e):
                directory.say(f"removed {e.name} (written by {e.writer}, step {e.step})")
        return None
    try:
        return _resume(directory, entries, settle, steps, readable, load)
    finally:  # NOTE [ Choosing before verifying ], 3.
        for e in entries:
            if e.header is None:
                directory.say(f"skipped {e.name}: {e.problem}")


def _resume(directory: CheckpointDirectory, entries: list[Entry], settle: Configure,
            steps: int, readable: Collection[str], load: Callable[[Entry], Any]) -> Resumed:
    """Choose, check and load the newest checkpoint among `entries` (headers read, digests
    not), verifying before acting (NOTE [ Choosing before verifying ]); `entries` is updated
    in place with what verifying found."""
    while True:
        candidates = [i for i, e in enumerate(entries) if e.verified or e.header is not None]
        if not candidates:
            raise CheckpointDirectoryError(
                f"nothing to resume in {directory.directory}: {_summary(entries)} (the newest, "
                f"{entries[-1].name}: {entries[-1].problem}); nothing was changed")
        i = candidates[-1]
        newest = entries[i]
        try:
            config = _check(directory, newest, settle, steps, readable)
        except Exception:  # a refusal: on the word of a verified header only (1.)
            if newest.verified or _verify(entries, i):
                raise
            continue
        try:
            state = load(newest)
        except CheckpointCorruptError:  # its digest, or its content once verified (2.)
            if newest.verified or _verify(entries, i):
                raise
            continue
        entries[i] = newest = dataclasses.replace(newest, verified=True)  # the load verified it
        for e in entries[:i + 1]:
            if (e.header is not None and e.payload == directory.payload
                    and not config_differences(e.config, config)):
                directory.own(e)
        return Resumed(newest, state)


def _verify(entries: list[Entry], i: int) -> bool:
    """Verify entries[i] (read with its digest) in place; whether it is still what its
    header said (False: it is unreadable, or it changed, and must be considered afresh)."""
    was = entries[i]
    entries[i] = read_entry(was.path, was.step)
    return entries[i].header is not None and entries[i].header == was.header


def _check(directory: CheckpointDirectory, newest: Entry, settle: Configure, steps: int,
           readable: Collection[str]) -> Mapping[str, Any]:
    """The run's configuration if it may continue from `newest`; else the refusal."""
    if newest.header is None:
        raise CheckpointDirectoryError(f"cannot resume from {newest.name}, the newest "
                                       f"checkpoint in {directory.directory}: {newest.problem}")
    config = settle(newest.config)
    differences = config_differences(newest.config, config)
    if differences:
        raise CheckpointMismatchError(f"cannot resume from {newest.name}: the configuration "
                                      f"changed: {'; '.join(differences)}")
    if newest.payload not in readable:
        raise CheckpointDirectoryError(
            f"cannot resume from {newest.name}: written by {newest.writer} (payload "
            f"{newest.payload!r}) and this run reads {', '.join(map(repr, sorted(readable)))} "
            "(the train command's --resume converts between the implementations)")
    if newest.step > steps:
        raise CheckpointDirectoryError(
            f"cannot resume from {newest.name}: it is at step {newest.step}, beyond the "
            f"{steps} steps asked for; ask for at least {newest.step} steps or choose another "
            "directory")
    return config
