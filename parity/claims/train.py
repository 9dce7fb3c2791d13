"""The train claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="train.resume_exact",
        statement=(
            "In each implementation, a run interrupted at any step (checkpoint written, every "
            "object dropped, resumed from the file) ends in the same complete state as the "
            "uninterrupted run: parameters, optimizer buffers, lr schedule, loss scale and "
            "tracker, random streams, data position and counters, for fp32, bf16 and fp16, with "
            "dropout and recomputation; for the MLP and for the transformer (--model gpt: "
            "block schedules and the selective attention core)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The resumed run executes the same operations on the same bits: the checkpoint holds "
            "every value the next step reads (the inventory in common/train_loop.py) and restores "
            "it by copy; the data order is a hash of (seed, epoch); nothing reads the global RNG "
            "(NOTE [ Dropout's stream is the default generator ]). Same process kind, same "
            "kernels, so no rounding can differ."
        ),
    ),
    Claim(
        id="train.kill_resume",
        statement=(
            "A `python -m parity train` process SIGKILLed at arbitrary moments while it writes a "
            "checkpoint every step, then restarted with --resume, prints the same state-sha256 as "
            "an uninterrupted process, and no kill leaves a checkpoint that fails to load; "
            "--model mlp and gpt, every precision and recompute option."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Atomic writes (NOTE [ Atomic write ]) leave either the old or the new file under a "
            "checkpoint's name, and the resumed run is exact (train.resume_exact); the digest is "
            "a function of the bits of the final state."
        ),
    ),
    Claim(
        id="train.digest_cross_impl",
        statement=(
            "reference.train.state_digest of a reference state equals "
            "torch_impl.train.state_digest of the same state mapped to torch "
            "(state_from_reference): the canonical digest is implementation-independent."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both hash the same length-prefixed records (NOTE [ Canonical state digest ]) built "
            "from the same bytes (the mapping is lossless: resume.cross_impl_state) and the same "
            "Python reprs of the scaler's floats and ints."
        ),
    ),
)

_RUN = ("train.resume_exact", "train.kill_resume")

_same = Twin.same


MANIFEST = Manifest(
    topic="train",
    modules=("reference.train", "torch_impl.train", "reference.train_models",
             "torch_impl.train_models", "reference.state_digest", "torch_impl.state_digest"),
    rows=(
        _same("train", "Run", *_RUN),
        _same("train", "restored", "train.resume_exact"),
        _same("train", "train", *_RUN),
        _same("train", "train_step", "train.resume_exact", "loss_scaling.train"),
        Twin("NextTokenLoss", reference="reference.gpt:NextTokenLoss",
             torch="torch_impl.train_models:NextTokenLoss", claims=("gpt.loss",)),
        _same("train_models", "Parts", "train.resume_exact"),
        _same("train_models", "gpt_config", "train.resume_exact"),
        _same("train_models", "build", "train.resume_exact"),
        _same("train_models", "batch_of", "train.resume_exact"),
        _same("state_digest", "as_array", "train.digest_cross_impl"),
        _same("state_digest", "state_digest", "train.digest_cross_impl", "train.kill_resume"),
    ),
    borrowed=(
        ("loss_scaling.train", "40 synced steps of each tree's train_step: loss scaling's "
                               "claim, for the clipping and skipping it exercises"),
        ("gpt.loss", "the reference computes it inside GPT.forward (reference/gpt.py): the "
                     "transformer's claim"),
    ),
    headline="parity/test_train.py::"
             "test_a_run_interrupted_at_step_2_of_4_and_resumed_is_the_straight_run_in_each_tree",
)
