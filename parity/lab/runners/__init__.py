"""The long runs behind the lab's commands: a profiled run (profile_run, profile_sheet), the
optimization gauntlet (optimize, optimize_spec, optimize_timing) and the mini-project.

A runner composes the proof's drivers and both trees into something a user runs and reads
(files, tables, verdicts); it holds no claim. The claims its outputs are held to live in
parity/claims/ and are tested in parity/test_<topic>.py.
"""
