"""Accelerate's `save_state` folder, read as what `Accelerator.load_state` restores
(accelerate 1.x, checkpointing.py), nothing run:

    file                        piece                              read with
    model.safetensors           weights (model_<i>.safetensors;    its header
                                pytorch_model.bin unsafe off)      (weights_only=True)
    optimizer.bin, _<i>         optimizer                          weights_only=True
    scheduler.bin, _<i>         LR scheduler                       weights_only=True
    scaler.pt                   GradScaler (fp16)                  weights_only=True
    random_states_<p>.pkl       a torch.save dict: python, numpy,  weights_only=True, numpy's
                                torch (cpu, cuda) RNG, and "step"  array globals allowed
    custom_checkpoint_<i>.pkl   a state_dict of each object given  weights_only=True
                                to register_for_checkpointing
    sampler.bin                 a seedable sampler over an         weights_only=True
                                IterableDatasetShard
    dl_state_dict.bin, _<i>     a StatefulDataLoader's state       weights_only=True
                                (use_stateful_dataloader=True)

The "step" in random_states_<p>.pkl is NOT the global step: it is `Accelerator.step`, the
gradient-accumulation counter (`_do_sync`: reset to 0 at the end of the dataloader, else
+1), which load_state puts back. Accelerate keeps no global step, epoch or data position:
the user's loop does, and saves them only by registering an object with
`accelerator.register_for_checkpointing(obj)` (obj.state_dict() goes to
custom_checkpoint_<i>.pkl), or by naming the folder as Accelerate's examples do
("step_<n>", "epoch_<n>": the loop parses the name on resume).

The data position, without use_stateful_dataloader: a loop resumed mid-epoch calls
`accelerator.skip_first_batches(dl, n)`, which starts a NEW pass over the DataLoader: a
shuffling sampler draws a new order (from the torch generator load_state restored, not the
one the straight run drew the epoch's order from), so the skipped batches are not the ones
trained on. At an epoch's end the resumed loop starts the next epoch, whose order the
DataLoader draws from its generator: the torch CPU generator load_state restores if it was
given no generator= of its own (exact), else its own, which no Accelerate file holds
(DataLoader(shuffle=True, generator=g), the documented way to make a loader reproducible: the
next epoch repeats the order g drew first). The folders of the two loops hold the same keys,
so such a folder is "unknown", never "exact"; exact where the loop registers the generator
for checkpointing (an object whose state_dict() holds g.get_state()): the registered state
is seen in custom_checkpoint_<i>.pkl as a torch generator's other than the torch CPU
generator's (random_states_<p>.pkl's), and never read as the torch CPU RNG. Measured
(MEASURED, held by tests/test_audit_accelerate_resume.py).

NOTE [ A stateful loader's resume ]
With DataLoaderConfiguration(use_stateful_dataloader=True), prepare() rebuilds the loader as a
torchdata StatefulDataLoader around the user's own batch sampler, save_state writes its
state_dict() to dl_state_dict.bin, and load_state hands it to load_state_dict() (before it
restores random_states_<p>.pkl): the next `for batch in dl` builds a new iterator from it, no
skip_first_batches. What decides the resume (torchdata 0.11, one process, no workers):
1. The order. A sampler with a state (torchdata's RandomSampler: its generator's state at the
   epoch's start, the samples yielded) is put back and fast-forwarded: the same order.
   Without one (torch's RandomSampler, which DataLoader(shuffle=True) makes) the state holds
   only the batches yielded, and the new iterator skips that many of a NEW order.
2. One iterator more. Every iterator draws a base seed from the DataLoader's generator
   (torch's _BaseDataLoaderIter), and the resumed loop builds one the straight run never did:
   mid-epoch, the one the state goes into; at an epoch's end, that one too, found finished
   and replaced. Without a generator of its own (the default) the draw comes from the torch
   CPU generator load_state restored, and dropout draws other masks; given the sampler's
   (StatefulDataLoader(shuffle=True, generator=g)) it moves the sampler's generator, and the
   next order differs. Exact with a generator apart from the sampler's, which no file
   records: such a folder is "unknown", never "exact".
3. random_states_<p>.pkl: without it the model draws from the generator as the new process
   left it.
MEASURED holds each (the loader given to prepare, where saved, with or without
random_states_0.pkl), asserted by tests/test_audit_accelerate_resume.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parity.lab.audit_files import safetensors_header, torch_file
from parity.lab.audit_recognize import (
    INCOMPLETE,
    MISSING,
    PRESENT,
    STEP_KEYS,
    TORCH_CPU_RNG_BYTES,
    UNSAFE,
    Audit,
    Row,
    Unloadable,
    is_tensor,
    recognize,
)

KIND = "Accelerate save_state folder"
MARKERS = re.compile(r"optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|sampler(_\d+)?\.bin"
                     r"|random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl"
                     r"|dl_state_dict(_\d+)?\.bin")
WEIGHTS = re.compile(r"(model|pytorch_model)(_\d+)?\.(safetensors|bin)")
RNG = re.compile(r"random_states_\d+\.pkl")
CUSTOM = re.compile(r"custom_checkpoint_\d+\.pkl")
LOADER = re.compile(r"dl_state_dict(_\d+)?\.bin")
NAMED = re.compile(r"(step|epoch)_(\d+)")  # Accelerate's examples' folder names
# an int the user's registered state may hold: batches done in the current epoch
IN_EPOCH = ("step_in_epoch", "batch_in_epoch", "batches_done", "batch_idx", "position")
# max |Δw| after the resume against a straight run, tensors differing (of 4): an MLP with
# dropout 0.2, AdamW, cosine lr, DataLoader(shuffle=True) of 6 batches an epoch, 3 epochs;
# "mid-epoch": saved after 4 batches, resumed by load_state + skip_first_batches(dl, 4);
# "boundary": saved at epoch 0's end; "boundary generator": the same with
# DataLoader(shuffle=True, generator=g), whose generator no file holds; "boundary registered
# generator": that loop with g registered for checkpointing (GENERATOR_FIX); "no step": the
# epoch 0 folder, the loop not knowing its step and so starting over at epoch 0. The rest:
# use_stateful_dataloader=True, resumed by load_state alone (NOTE [ A stateful loader's
# resume ]), "<loader> <where>[ no rng]": the loader given to prepare, LOADERS' names;
# "mid-epoch" saved after 4 batches, "boundary" at epoch 0's end; "no rng" the same folder
# without random_states_0.pkl
MEASURED = {"mid-epoch": (0.0241, 4), "boundary": (0.0, 0), "no step": (0.00237, 4),
            "boundary generator": (0.0172, 4), "boundary registered generator": (0.0, 0),
            "stateless mid-epoch": (0.0241, 4), "stateless boundary": (0.0213, 4),
            "stateless mid-epoch no rng": (0.0356, 4), "stateless boundary no rng": (0.0184, 4),
            "stateful mid-epoch": (0.0152, 4), "stateful boundary": (0.0146, 4),
            "stateful mid-epoch no rng": (0.0203, 4), "stateful boundary no rng": (0.0111, 4),
            "shared generator mid-epoch": (0.0155, 4),
            "shared generator boundary": (0.0155, 4),
            "shared generator mid-epoch no rng": (0.0277, 4),
            "shared generator boundary no rng": (0.0142, 4),
            "own generator mid-epoch": (0.0, 0), "own generator boundary": (0.0, 0),
            "own generator mid-epoch no rng": (0.0184, 4),
            "own generator boundary no rng": (0.0148, 4)}
LOADERS = {"stateless": "DataLoader(shuffle=True)",
           "stateful": "StatefulDataLoader(shuffle=True)",
           "shared generator": "StatefulDataLoader(shuffle=True, generator=g)",
           "own generator": "StatefulDataLoader(sampler=RandomSampler(data), generator=g)"}
# the "boundary registered generator" loop, measured exact at an epoch's end
GENERATOR_FIX = ("give the DataLoader a generator and register it for checkpointing: "
                 "DataLoader(data, shuffle=True, generator=g) and "
                 "accelerator.register_for_checkpointing(obj), obj.state_dict() returning "
                 "{'generator': g.get_state()} and obj.load_state_dict(s) calling "
                 "g.set_state(s['generator']) (measured exact at an epoch's end)")
FIX = ("save_state at epoch ends only, with the global step registered "
       "(accelerator.register_for_checkpointing of an object whose state_dict() holds "
       f"global_step, epoch and step_in_epoch); {GENERATOR_FIX}")
# the "own generator" loader, measured exact (RandomSampler: torchdata's, whose state holds
# its generator; the DataLoader's generator apart from it)
STATEFUL_FIX = ("give the sampler and the DataLoader a generator each: StatefulDataLoader(data, "
                "batch_size=b, sampler=torchdata.stateful_dataloader.sampler.RandomSampler(data), "
                "generator=torch.Generator().manual_seed(seed)) (measured exact mid-epoch and at "
                "an epoch's end, random_states_0.pkl kept)")


def is_accelerate_folder(names: list[str]) -> bool:
    return any(MARKERS.fullmatch(n) for n in names)


def audit_accelerate(path: Path) -> Audit:
    """The Audit of a save_state folder `path` (the table above)."""
    from parity.lab.your_trainer.audit import NUMPY_ARRAY

    tree: dict[str, Any] = {}
    for p in sorted(path.iterdir()):
        if not p.is_file() or p.is_symlink():
            continue
        if WEIGHTS.fullmatch(p.name) and p.suffix == ".safetensors":
            tree[p.name] = safetensors_header(p)
        elif RNG.fullmatch(p.name):
            tree[p.name] = torch_file(p, NUMPY_ARRAY)
        elif WEIGHTS.fullmatch(p.name) or MARKERS.fullmatch(p.name) or p.name == "scaler.pt":
            tree[p.name] = torch_file(p)
    # a loader's state holds its sampler's generator, never the torch CPU generator's
    loaders = {n: tree.pop(n) for n in sorted(tree) if LOADER.fullmatch(n)}
    generators = _own_generators(tree)
    audit = recognize(tree, KIND)
    audit.flags[:] = [f for f in audit.flags if not f.startswith("legacy np.random")]
    custom = {n: v for n, v in tree.items() if CUSTOM.fullmatch(n) and isinstance(v, dict)}
    named = NAMED.fullmatch(path.name)
    _step(audit, tree, custom, named)
    if loaders:
        _stateful(audit, loaders)
    else:
        _position(audit, tree, custom, named, generators)
    return audit


def _is_generator_state(v: Any) -> bool:
    """A torch.Generator's get_state(): a uint8 tensor of TORCH_CPU_RNG_BYTES."""
    return (is_tensor(v) and str(v.dtype).removeprefix("torch.") == "uint8"
            and tuple(v.shape) == (TORCH_CPU_RNG_BYTES,))


def _own_generators(tree: dict[str, Any]) -> list[str]:
    """Where the registered states (custom_checkpoint_<i>.pkl) hold a torch generator's state
    other than the torch CPU generator's (random_states_<p>.pkl's): the loop's own generators,
    taken out of `tree` so that they are not read as the torch CPU RNG."""
    torch_states = [v["torch_manual_seed"] for n, v in tree.items() if RNG.fullmatch(n)
                    and isinstance(v, dict) and _is_generator_state(v.get("torch_manual_seed"))]
    found: list[str] = []

    def strip(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            return value
        kept = {}
        for k, v in value.items():
            if _is_generator_state(v) and not any(bool((v == t).all()) for t in torch_states):
                found.append(f"{path}/{k}")
            else:
                kept[k] = strip(v, f"{path}/{k}")
        return kept

    for name in [n for n in tree if CUSTOM.fullmatch(n)]:
        tree[name] = strip(tree[name], name)
    return found


def _set(audit: Audit, item: str, status: str, where: str, detail: str,
         need: str | None = None) -> None:
    i = next(n for n, r in enumerate(audit.rows) if r.item == item)
    audit.rows[i] = Row(item, status, where, detail, audit.rows[i].need if need is None
                        else need)


def _int(v: Any) -> int | None:
    """An int, or a one-element integer tensor's value; else None."""
    if is_tensor(v) and v.numel() == 1 and not v.is_floating_point():
        return int(v.item())
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _registered(custom: dict[str, dict[str, Any]], keys: tuple[str, ...]
                ) -> tuple[str, int] | None:
    """(where, value) of the first int under one of `keys` in a registered state."""
    for name, state in custom.items():
        for key in keys:
            if key in state and _int(state[key]) is not None:
                return f"{name}/{key}", _int(state[key])
    return None


def _step(audit: Audit, tree: dict[str, Any], custom: dict[str, dict[str, Any]],
          named: re.Match[str] | None) -> None:
    """The global step and epoch: registered, or in the folder's name; never the pickled
    accumulation counter."""
    counters = [f"{n}'s 'step' = {v['step']}" for n, v in tree.items()
                if RNG.fullmatch(n) and isinstance(v, dict) and "step" in v]
    step = _registered(custom, STEP_KEYS)
    if step:
        _set(audit, "global step", PRESENT, step[0], f"{step[1]} (registered for "
                                                      "checkpointing)")
    elif named and named.group(1) == "step":
        _set(audit, "global step", PRESENT, "the folder's name", f"{named.group(2)}, from "
             f"{named.group(0)} (the loop must parse it on resume, as Accelerate's "
             "examples do)")
    else:
        _set(audit, "global step", MISSING, "", (
            f"{', '.join(counters)} is Accelerate's gradient-accumulation counter "
            "(Accelerator.step), not the global step; " if counters else "")
            + "none registered (accelerator.register_for_checkpointing)")
    epoch = _registered(custom, ("epoch",))
    if epoch:
        _set(audit, "epoch", PRESENT, epoch[0], str(epoch[1]))
    elif named and named.group(1) == "epoch":
        _set(audit, "epoch", PRESENT, "the folder's name", f"{named.group(2)}, from "
             f"{named.group(0)} (saved at that epoch's end)")
    elif audit.row("global step").status == PRESENT:
        _set(audit, "epoch", MISSING, "", "the loop derives it as global step // batches "
             "an epoch, as Accelerate's examples do", "if not derived from the global step")


def _position(audit: Audit, tree: dict[str, Any], custom: dict[str, dict[str, Any]],
              named: re.Match[str] | None, generators: list[str]) -> None:
    """Where in the epoch the folder was saved, and so whether the resume is exact (no
    dl_state_dict.bin: the loop skips batches itself); `generators`: the loop's own
    generators registered for checkpointing."""
    samplers = sorted(n for n in tree if n.startswith("sampler"))
    at = _registered(custom, IN_EPOCH)
    mid, boundary, own, registered = (MEASURED[k] for k in (
        "mid-epoch", "boundary", "boundary generator", "boundary registered generator"))
    if samplers:
        _set(audit, "data position", PRESENT, ", ".join(samplers), "a seedable sampler's state")
        audit.unknown = (f"{', '.join(samplers)}: a seedable sampler's saved state, which this "
                         "audit has not held to a resume; unknown")
    elif ((at and at[1] == 0) or (named and named.group(1) == "epoch")) and generators:
        _set(audit, "data position", PRESENT,
             ", ".join([at[0] if at else "the folder's name", *generators]),
             "at an epoch's end, a generator of the loop's own registered for checkpointing: "
             "the resumed loop starts the next epoch, whose order the DataLoader draws from "
             "its generator= (measured, registered: max |Δw| "
             f"{registered[0]:g}), or without one from the torch generator load_state "
             f"restores (measured: max |Δw| {boundary[0]:g})")
    elif (at and at[1] == 0) or (named and named.group(1) == "epoch"):
        _set(audit, "data position", PRESENT, at[0] if at else "the folder's name",
             "at an epoch's end: the resumed loop starts the next epoch, whose order the "
             "DataLoader draws from its generator")
        audit.unknown = (
            "saved at an epoch's end: the next epoch's order comes from the DataLoader's "
            "generator, the torch generator load_state restores if it has no generator= of "
            f"its own (measured: max |Δw| {boundary[0]:g}), else its own, which no file "
            "holds (DataLoader(shuffle=True, generator=g) measured: max |Δw| "
            f"{own[0]:g}, {own[1]} tensors differing). Fix: {GENERATOR_FIX}")
    else:
        seen = (f"{at[1]} batches into the epoch ({at[0]})" if at
                else "where in the epoch it was saved cannot be seen (no registered "
                     "step_in_epoch, no epoch_<n> name)")
        _set(audit, "data position", MISSING, at[0] if at else "", seen,
             "if saved mid-epoch")
        if audit.row("global step").status == PRESENT:
            audit.unknown = (
                f"Accelerate saves no data position; {seen}. Mid-epoch, the resumed loop's "
                "skip_first_batches(dl, n) starts a new pass whose shuffled order is not the "
                f"straight run's (measured: max |Δw| {mid[0]:g}, {mid[1]} tensors "
                f"differing). Fix: {FIX}")


def _loader(name: str, state: Any) -> tuple[str, str, str, str | None]:
    """(status, detail, where in the epoch, why unknown) of one dl_state_dict's state, read
    as NOTE [ A stateful loader's resume ] says it resumes."""
    if isinstance(state, Unloadable):
        return UNSAFE, f"{name}: {state.reason}", "", None
    if not isinstance(state, dict) or "_num_yielded" not in state:
        return PRESENT, f"{name}: a loader's state", "", (
            f"{name} is not a one-process StatefulDataLoader's state (with worker processes "
            "its iterator's state is another), which this audit has not held to a resume")
    end = state.get("_iterator_finished") is True
    stage = "boundary" if end else "mid-epoch"
    at = "at an epoch's end" if end else f"{state['_num_yielded']} batches into the epoch"
    sampler = state.get("_sampler_iter_state")
    inner = sampler.get("sampler_iter_state") if isinstance(sampler, dict) else None
    others = [k for k in ("_index_sampler_state", "dataset_state", "fetcher_state")
              if state.get(k) is not None]
    if sampler is None and not others:
        cost = MEASURED[f"stateless {stage}"]
        why = (f"the resumed loader skips {state['_num_yielded']} batches of a newly drawn "
               "order" if not end else "the resumed loader draws once more from the torch "
               "CPU generator, which the next epoch's order is drawn from")
        return INCOMPLETE, (
            f"{name}: {at}, and no sampler state (torch's RandomSampler, which "
            f"DataLoader(shuffle=True) makes, saves none): {why} (measured: max |Δw| "
            f"{cost[0]:g}, {cost[1]} tensors differing). Fix: {STATEFUL_FIX}"), stage, None
    if others or not isinstance(inner, dict) or set(inner) != {"yielded", "generator"}:
        return PRESENT, f"{name}: {at}, a sampler state", stage, (
            f"{name} holds a sampler or dataset state other than torchdata's RandomSampler "
            "(its generator and the samples yielded), which this audit has not held to a "
            "resume")
    own, default, shared = (MEASURED[f"{k} {stage}"] for k in ("own generator", "stateful",
                                                              "shared generator"))
    return PRESENT, f"{name}: {at}, the sampler's generator and samples yielded", stage, (
        f"{name} ({at}) holds the sampler's generator, so the order resumes, but not whether "
        "the DataLoader has a generator of its own: the resumed loader builds one iterator "
        "more than the straight run, which draws a seed from it. Without one (the default) "
        "that is the torch CPU generator, and dropout draws other masks (measured: max |Δw| "
        f"{default[0]:g}, {default[1]} tensors differing); the sampler's own "
        f"({LOADERS['shared generator']}) moves the order (measured: max |Δw| "
        f"{shared[0]:g}, {shared[1]} tensors differing); one apart from the sampler's: exact "
        f"(measured: max |Δw| {own[0]:g}). Fix: {STATEFUL_FIX}")


def _stateful(audit: Audit, loaders: dict[str, Any]) -> None:
    """The data position from each StatefulDataLoader's saved state (dl_state_dict.bin), and
    what the torch CPU generator's absence costs such a resume."""
    read = [_loader(n, v) for n, v in loaders.items()]
    worst = next((r for r in read if r[0] != PRESENT), read[0])
    _set(audit, "data position", worst[0], ", ".join(loaders),
         "; ".join(r[1] for r in read))
    audit.unknown = "; ".join(r[3] for r in read if r[3]) or None
    rng = audit.row("torch CPU RNG")
    stage = next((r[2] for r in read if r[2]), "mid-epoch")
    if rng.status == MISSING:
        cost = MEASURED[f"own generator {stage} no rng"]
        _set(audit, "torch CPU RNG", MISSING, "", (
            "no random_states_<p>.pkl, which save_state writes and load_state restores after "
            "the loader: the resumed run draws from the generator as the new process left "
            "it, even with a loader that otherwise resumes exactly (measured: max |Δw| "
            f"{cost[0]:g}, {cost[1]} tensors differing)"))
