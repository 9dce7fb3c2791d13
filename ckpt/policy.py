"""What a training run does with what it finds in its checkpoint directory: the one policy
both trees' train() follow (it does not depend on the library).

`start(...)` decides, before a step is trained, where the run begins: at step 0, or from
one checkpoint (the caller loads it, converting another tree's payload if it can), or not
at all (a CheckpointError with a one-line reason, and nothing in the directory changed).
`due(...)` says after which steps a checkpoint is written. POLICY is the same rules as a
table (docs/resume.md prints it); each row names the test that holds the code to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ckpt.directory import CheckpointDirectory, Entry
from ckpt.errors import CheckpointDirectoryError, CheckpointMismatchError
from ckpt.match import config_differences

POLICY: tuple[tuple[str, str, str], ...] = (
    # (what the run finds, what it does, the test: tests/test_resume_policy.py)
    ("no entry under a checkpoint name (with or without `--resume`)",
     "starts at step 0; with `--resume` it says there was nothing to resume",
     "test_resume_with_nothing_to_resume_says_so_and_starts_at_step_0"),
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
     "deletes the checkpoints it owns (wrote, or verified as its own at the start) beyond "
     "the newest `--keep`; nothing else counts or is deleted",
     "test_pruning_counts_and_deletes_only_owned_checkpoints"),
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


def start(directory: CheckpointDirectory, *, config: Mapping[str, Any], steps: int,
          resume: bool, overwrite: bool, readable: Collection[str]) -> Entry | None:
    """The checkpoint to continue from, or None for step 0 (POLICY, module docstring).

    `readable`: the payload kinds the caller can load (its own, and those it can convert).
    Verified checkpoints of this payload and configuration become owned (prunable).
    """
    where = directory.directory
    if resume and overwrite:
        raise CheckpointDirectoryError("--resume continues the run in a directory and "
                                       "--overwrite starts a new one there: choose one")
    entries = directory.scan()
    if not entries:
        if resume:
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
    for e in entries:
        if e.header is None:
            directory.say(f"skipped {e.name}: {e.problem}")
    verified = [e for e in entries if e.verified]
    if not verified:
        newest = entries[-1]
        raise CheckpointDirectoryError(
            f"nothing to resume in {where}: {_summary(entries)} (the newest, {newest.name}: "
            f"{newest.problem}); nothing was changed")
    newest = verified[-1]
    if newest.header is None:
        raise CheckpointDirectoryError(f"cannot resume from {newest.name}, the newest "
                                       f"checkpoint in {where}: {newest.problem}")
    differences = config_differences(newest.config, config)
    if differences:
        raise CheckpointMismatchError(f"cannot resume from {newest.name}: the configuration "
                                      f"changed: {'; '.join(differences)}")
    if newest.payload not in readable:
        raise CheckpointDirectoryError(
            f"cannot resume from {newest.name}: written by {newest.writer} (payload "
            f"{newest.payload!r}) and this run reads {', '.join(map(repr, sorted(readable)))} "
            "(`python -m parity train --resume` converts between the implementations)")
    if newest.step > steps:
        raise CheckpointDirectoryError(
            f"cannot resume from {newest.name}: it is at step {newest.step}, beyond the "
            f"{steps} steps asked for; ask for at least {newest.step} steps or choose another "
            "directory")
    for e in verified:
        if (e.header is not None and e.payload == directory.payload
                and not config_differences(e.config, config)):
            directory.own(e)
    return newest
