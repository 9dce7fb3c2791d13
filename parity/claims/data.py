"""The data claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="data.task",
        statement=(
            "make_task(seed, n, ...) gives bit-identical inputs, labels and values in the "
            "reference (NumPy) and the torch twin, computed independently, float32 and float64."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Words are integer hashes mod 2^32 (exact on both sides: uint64 products in NumPy, "
            "split 32x16-bit int64 products in torch); inputs are k * 2^-23, exact; the teacher "
            "uses small integer weights, so every partial sum is a multiple of 2^-23 below 2^18: "
            "exact in float64 in any BLAS order (NOTE [ Exact teacher arithmetic ]); float32 is "
            "then one correctly rounded cast; argmax takes the first maximum in both."
        ),
    ),
    Claim(
        id="data.order",
        statement=(
            "epoch_order(seed, epoch, n) is the same permutation in the reference and in torch, "
            "for every seed and epoch in [0, 2^32)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The order is the argsort of hashed words (integer ops, exact on both sides); the "
            "hash is a bijection of the index, so the words are distinct and the sorted order is "
            "unique: numpy.argsort and torch.argsort cannot disagree."
        ),
    ),
    Claim(
        id="data.resume_reference",
        statement=(
            "In the reference, saving ResumableSampler.state_dict() after any number of batches "
            "(mid-epoch, at an epoch boundary, with or without drop_last) and loading it into a "
            "fresh sampler yields the same remaining batches as the uninterrupted run."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The order of an epoch is a pure function of (seed, epoch) and the state counts "
            "exactly the indices consumed; index streams are integers, compared exactly."
        ),
    ),
    Claim(
        id="data.resume_torch",
        statement=(
            "In torch, a DataLoader from make_loader over a ResumableSampler restored from "
            "state_dict() after any number of batches yields the same remaining batches (inputs, "
            "labels, values, batch sizes) as the uninterrupted DataLoader."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Single-process DataLoader pulls exactly one batch of indices per next(), so the "
            "sampler state is what was consumed; batches are copies of dataset rows, no "
            "arithmetic."
        ),
    ),
    Claim(
        id="data.length",
        statement=(
            "After any number of samples consumed (drawn, or restored by load_state_dict), "
            "len(sampler) and len(loader) are the same in both implementations and equal to "
            "the indices and batches the next iter() then yields, with or without drop_last."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers. len(sampler) is num_samples - position, the rest of the "
            "epoch; the batch count is its floor or ceiling by the batch size "
            "(torch.utils.data.BatchSampler's rule, mirrored by the reference); a length that "
            "ignores the position would announce a full epoch that never comes."
        ),
    ),
    Claim(
        id="data.loader",
        statement=(
            "The batch stream of make_loader, and of torch's WorkerLoader with worker "
            "processes, is bit-identical across implementations; a sampler state saved by one "
            "resumes the same stream in the other; batch_seed is the same word in both."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Same dataset bits (data.task), same order (data.order), the same batching rule "
            "(reference BatchSampler mirrors torch.utils.data.BatchSampler) and one state format "
            "of plain ints; batching copies rows without arithmetic. Worker processes change "
            "when indices are drawn, not which: WorkerLoader's state is the consumed position "
            "(NOTE [ Consumed position ]), the reference's order. batch_seed is one word of the "
            "integer hash, exact on both sides."
        ),
    ),
)


_same = Twin.same
_HASH, _TASK, _COPY = ("data.order", "data.task"), ("data.task",), ("gpt.copy_task",)
_RESUME = ("data.resume_reference", "data.resume_torch", "data.loader", "data.length")
_WORKERS = "worker processes are torch's: the reference is one process, in the same order"

MANIFEST = Manifest(
    topic="data",
    modules=("reference.data", "torch_impl.data", "torch_impl.data_workers"),
    rows=(
        _same("data", "MASK32", *_HASH),
        _same("data", "MIX_MUL1", *_HASH),
        _same("data", "MIX_MUL2", *_HASH),
        _same("data", "ORDER", "data.order"),
        _same("data", "INPUTS", *_TASK),
        _same("data", "TEACHER", *_TASK),
        _same("data", "CALIBRATION", *_TASK),
        _same("data", "SEQUENCES", *_COPY),
        _same("data", "LOADER", "data.loader"),
        _same("data", "BATCH", "data.loader"),
        _same("data", "PURPOSES"),
        _same("data", "CALIBRATION_SIZE", *_TASK),
        _same("data", "INPUT_STEP", *_TASK),
        _same("data", "VALUE_SCALE", *_TASK),
        _same("data", "STATE_KEYS", *_RESUME),
        _same("data", "mix32", *_HASH),
        _same("data", "hash_words", *_HASH),
        _same("data", "epoch_order", "data.order"),
        _same("data", "batch_seed", "data.loader"),
        _same("data", "Task", *_TASK),
        _same("data", "teacher_weights", *_TASK),
        _same("data", "teacher_logits", *_TASK),
        _same("data", "make_task", *_TASK),
        _same("data", "SequenceTask", *_COPY),
        _same("data", "make_copy_task", *_COPY),
        _same("data", "ResumableSampler", *_RESUME),
        Twin("BatchSampler", reference="reference.data:BatchSampler",
             alias="torch.utils.data.BatchSampler", claims=("data.loader", "data.length")),
        Twin("Loader", reference="reference.data:Loader", alias="torch.utils.data.DataLoader",
             claims=("data.loader", "data.length")),
        _same("data", "make_loader", *_RESUME),
        Twin("Augment", torch="torch_impl.data_workers:Augment", why=_WORKERS),
        Twin("TIMEOUT_S", torch="torch_impl.data_workers:TIMEOUT_S", why=_WORKERS),
        Twin("BatchKey", torch="torch_impl.data_workers:BatchKey", why=_WORKERS),
        Twin("WorkerLoader", reference="reference.data:Loader",
             torch="torch_impl.data_workers:WorkerLoader", claims=("data.loader",)),
    ),
    borrowed=(("gpt.copy_task", "the copy task is the transformer's data: gpt claims it, "
                                "with a resume from the other tree"),),
    headline="parity/test_data.py::test_loader_resumed_mid_epoch_matches_torch_dataloader_bitwise",
)
