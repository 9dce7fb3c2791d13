"""The resume claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="resume.cross_impl_state",
        statement=(
            "A reference training state mapped to torch (torch_impl.resume.state_from_reference), "
            "saved and loaded as a torch checkpoint, loaded into torch.nn / torch.optim / "
            "lr_scheduler objects, read back with their state_dict() and mapped home "
            "(state_to_reference) equals the original in every parameter, optimizer buffer, step "
            "count, lr, scheduler field, scaler value, data position and counter, bit for bit."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Every step is a copy: the same keys and (out, in) layouts on both sides, tensors "
            "made from the arrays' bytes (torch.from_numpy of a copy, .numpy() back), Python "
            "floats and ints copied as objects; no arithmetic touches a value. Random streams are "
            "not mapped (NOTE [ Cross-implementation mapping ]) and not compared."
        ),
    ),
    Claim(
        id="resume.crafted_refused",
        statement=(
            "Loading each file of a table of crafted checkpoints (a valid digest around hostile "
            "content: lengths beyond the file, nesting deeper than any parser's recursion or "
            "than ckpt.MAX_DEPTH, a state that is not a dict, a structure that does not fit "
            "its records) ends the same way in both trees: CheckpointCorruptError, without "
            "allocating what a length declares; the table's control file loads in both. "
            "Version-gated: torch 2.6 loads a storage declared larger than its zip record from "
            "the record's own bytes (no check, nothing allocated from the declared size); "
            "2.11 and later refuse it."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The container's bounds are checked once, in the shared ckpt package, before "
            "either payload is parsed; each payload decoder checks every declared length "
            "against the bytes left and the decoded state against ckpt.check_state. The "
            "outcome is a class, compared exactly."
        ),
        library=("torch",),
    ),
    Claim(
        id="resume.cross_impl_resume",
        statement=(
            "`python -m parity train --resume` with one implementation, on a directory whose "
            "newest checkpoint the OTHER implementation wrote at step k, continues through the "
            "state mapping and says so: asked for k steps it prints the writer's state-sha256, "
            "in both directions; continued to n > k, its step counter, data position, skipped "
            "count and lr equal those of an uninterrupted run of its own implementation, and "
            "so does the random bits' stream of a precision that rounds stochastically "
            "(bf16-sr, whose optimizer has no torch class, and nvfp4; the GPT)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The mapping is lossless (resume.cross_impl_state) and the digest is "
            "implementation-independent (train.digest_cross_impl); the counters, the data order "
            "(a hash of (seed, epoch)) and the lr schedule (a function of the applied updates, "
            "fp32: none skipped) do not depend on the arithmetic. The parameters after the "
            "switch are NOT claimed equal: the trees' matmuls round differently, and the dropout "
            "streams restart from the seed; the bits of stochastic rounding are one PCG64 "
            "stream in both trees, its state copied (NOTE [ Cross-implementation mapping ])."
        ),
    ),
)

_same = Twin.same
_CROSS = ("resume.cross_impl_state", "resume.cross_impl_resume")
_CRAFTED = ("resume.crafted_refused",)
_MAPPING = "the mapping between the trees' states: the reference's is the one both map to"


MANIFEST = Manifest(
    topic="resume",
    modules=("reference.resume", "torch_impl.resume"),
    rows=(
        _same("resume", "PAYLOAD", *_CROSS),
        _same("resume", "WRITER", *_CROSS),
        _same("resume", "write_state", *_CROSS),
        _same("resume", "decode_state", *_CROSS, *_CRAFTED),
        _same("resume", "save_checkpoint", *_CROSS),
        _same("resume", "load_checkpoint", *_CROSS, *_CRAFTED),
        _same("resume", "CheckpointManager", "resume.cross_impl_resume"),
        Twin("MAPPED_KEYS", torch="torch_impl.resume:MAPPED_KEYS", claims=_CROSS, why=_MAPPING),
        Twin("CONVERTED", torch="torch_impl.resume:CONVERTED", claims=_CROSS, why=_MAPPING),
        Twin("state_from_reference", torch="torch_impl.resume:state_from_reference",
             claims=_CROSS, why=_MAPPING),
        Twin("state_to_reference", torch="torch_impl.resume:state_to_reference",
             claims=_CROSS, why=_MAPPING),
    ),
    headline="parity/test_resume.py::"
             "test_an_adamw_state_saved_and_restored_by_either_tree_comes_back_alike",
)
