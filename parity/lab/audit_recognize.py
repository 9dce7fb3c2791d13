"""What a checkpoint holds for an exact resume, recognized from the loaded objects alone.

No library is imported: a tensor is anything with a `dtype` and a `shape` (a torch.Tensor, a
NumPy array, a safetensors header entry), so the same rules read a torch.save dict, a
Lightning `.ckpt`, an Accelerate folder (one entry per file) and this project's own
checkpoints. The rules, by structure first and by key name only where structure cannot say:

    item                    recognized as
    model                   a dict of str -> tensor with a floating tensor (not inside an
                            optimizer's "state"), e.g. "model", "state_dict", model.safetensors
    optimizer               a dict with "state" and "param_groups" (Lightning:
                            "optimizer_states", a list of them)
    optimizer step counts   "step" in every per-parameter state of an optimizer
    scheduler               a dict with "last_epoch" and "_step_count" or "base_lrs"
    scaler                  a dict with "scale" and "growth_factor" ("_growth_tracker": its
                            growth count; without it GradScaler.load_state_dict raises
                            KeyError); {} under a key named like a scaler: disabled
    torch CPU RNG           a uint8 tensor of 5056 bytes (the Mersenne Twister state
                            torch.get_rng_state() returns), outside any "cuda" key
    CUDA RNG                a uint8 tensor or a list of them under a key naming "cuda"
    numpy RNG               a Generator's {"bit_generator": ..., "state": ...}, or the legacy
                            ("MT19937", 624 words, pos, has_gauss, cached_gaussian)
    Python random           random.getstate(): (3, 625 ints, None)
    data position           a key naming the sampler or the data state, an int such as
                            "consumed_samples", or Lightning's "loops"
    epoch                   an int "epoch" (top level, or in the data position)
    global step             an int "global_step", "step", "iter_num", ... at the top level

`Unloadable` stands for a file that weights_only refuses (or a pickle not even offered to
it); the names its pickle mentions (read statically, nothing run) still say what it holds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

ITEMS = ("model", "optimizer", "optimizer step counts", "scheduler", "scaler", "torch CPU RNG",
         "CUDA RNG", "numpy RNG", "Python random", "data position", "epoch", "global step")
PRESENT, MISSING, INCOMPLETE, UNSAFE, DISABLED, NOT_NEEDED = (
    "present", "missing", "incomplete", "present, not loadable safely", "disabled",
    "not needed")
# what an exact resume can use: UNSAFE is not among them (its state loads only with pickle)
OK_STATUSES = (PRESENT, DISABLED, NOT_NEEDED)
REQUIRED = "required"
TORCH_CPU_RNG_BYTES = 5056  # 624 words of the Mersenne state, its position, the seed, ...
DATA_KEYS = ("data", "sampler", "data_position", "dataloader", "data_state", "dl_state_dict",
             "loader", "sampler_state", "train_sampler", "data_loader")
POSITION_INTS = ("consumed_samples", "consumed_train_samples", "samples_seen", "batch_idx",
                 "data_position", "tokens_seen", "position")
STEP_KEYS = ("global_step", "step", "iter_num", "iteration", "num_updates", "global_steps")
SCALER_KEYS = ("scaler", "grad_scaler", "gradscaler", "native_amp_scaling_state",
               "mixedprecision")
# the names Accelerate's random_states_<i>.pkl stores its states under
# (not its "step": Accelerator.step, an accumulation counter; see audit_accelerate.py)
ACCELERATE_RNG = {"random_state": "Python random", "numpy_random_seed": "numpy RNG",
                  "torch_manual_seed": "torch CPU RNG", "torch_cuda_manual_seed": "CUDA RNG"}
FP16_NAMES = ("fp16", "float16", "16", "16-mixed", "half")
NOT_FP16_NAMES = ("fp32", "float32", "32", "32-true", "bf16", "bfloat16", "bf16-mixed",
                  "bf16-true", "64")


class AuditInputError(Exception):
    """What was given cannot be audited: a missing path, a file that is no checkpoint, a
    damaged one, a folder of an unsupported layout (one line saying which)."""


@dataclass(frozen=True)
class Unloadable:
    """A file not loaded: `reason` why, `needs` the globals its pickle names, `names` the
    strings it holds (dict keys among them)."""

    reason: str
    needs: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Row:
    item: str  # one of ITEMS
    status: str  # PRESENT, MISSING, ...
    where: str = ""  # the key path or file
    detail: str = ""
    need: str = REQUIRED  # or the condition under which the item is needed


@dataclass
class Audit:
    kind: str
    rows: list[Row] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    refused: str | None = None  # why no exact resume, whatever the rows: the file needs
    # pickle, or it is one rank's file, an uncommitted step, a step without its config
    needs: tuple[str, ...] = ()  # the globals its pickle needs
    unknown: str | None = None  # why the rows cannot settle an exact resume, when nothing
    # required is missing (a data position that cannot be verified)

    def gaps(self) -> list[Row]:
        """The required rows an exact resume cannot use."""
        return [r for r in self.rows if r.need == REQUIRED and r.status not in OK_STATUSES]

    @property
    def exact(self) -> bool:
        """Exact resume is possible: read, every required item there, nothing unknown."""
        return self.refused is None and not self.gaps() and self.unknown is None

    def row(self, item: str) -> Row:
        return next(r for r in self.rows if r.item == item)


def is_tensor(value: Any) -> bool:
    return (hasattr(value, "dtype") and hasattr(value, "shape")
            and not isinstance(value, bool | int | float | str))


def _dtype(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.")


def _numel(value: Any) -> int:
    return math.prod(int(n) for n in value.shape)


def _name(key: Any) -> str:
    """A key as a name: lower case, a file's extension and a trailing _<n> dropped."""
    text = str(key).lower()
    text = re.sub(r"\.(bin|pt|pth|pkl|ckpt|safetensors)$", "", text)
    return re.sub(r"_\d+$", "", text)


def _walk(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, node) of every node, the value itself first; 40 levels at most."""
    yield path, value
    if depth > 40:
        return
    items = (value.items() if isinstance(value, Mapping)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    for key, child in items:
        yield from _walk(child, f"{path}/{key}" if path else str(key), depth + 1)


def _is_optimizer(v: Any) -> bool:
    return (isinstance(v, Mapping) and "state" in v and isinstance(v.get("param_groups"), list)
            and all(isinstance(g, Mapping) and "params" in g for g in v["param_groups"]))


def _is_scheduler(v: Any) -> bool:
    return isinstance(v, Mapping) and "last_epoch" in v and ("_step_count" in v
                                                             or "base_lrs" in v)


def _is_scaler(v: Any) -> bool:
    return isinstance(v, Mapping) and "scale" in v and "growth_factor" in v


def _is_model(v: Any) -> bool:
    return (isinstance(v, Mapping) and len(v) > 0 and all(isinstance(k, str) for k in v)
            and all(is_tensor(t) for t in v.values())
            and any("float" in _dtype(t) for t in v.values()))


def _is_legacy_numpy(v: Any) -> bool:
    return (isinstance(v, list | tuple) and len(v) >= 3 and v[0] == "MT19937"
            and hasattr(v[1], "__len__") and len(v[1]) == 624)


def _is_python_random(v: Any) -> bool:
    return (isinstance(v, tuple | list) and len(v) == 3 and v[0] == 3
            and isinstance(v[1], tuple | list) and len(v[1]) == 625)


def _is_int(v: Any) -> bool:
    if is_tensor(v):
        return _numel(v) == 1 and "int" in _dtype(v)
    return isinstance(v, int) and not isinstance(v, bool)


def _under(path: str, roots: list[str]) -> bool:
    return any(r == "" or path == r or path.startswith(r + "/") for r in roots)  # "": the file


def _fp16(state: Any) -> bool | None:
    """Whether the run trained in fp16, from a configuration it saved (None: not said)."""
    for path, v in _walk(state):
        key = _name(path.rsplit("/", 1)[-1])
        if key in ("precision", "dtype", "mixed_precision") and isinstance(v, str | int):
            text = str(v).lower()
            if text in FP16_NAMES:
                return True
            if text in NOT_FP16_NAMES:
                return False
    return None


def recognize(state: Any, kind: str | None = None, generator: str = "torch") -> Audit:
    """The Audit of a loaded checkpoint `state`; `kind` names the format when the loader knows
    it (a folder, this project's container), else it is read from the keys. `generator`: the
    one the model's dropout draws from, "torch" (the CPU generator is required) or "numpy"
    (this project's reference tree: the numpy Generator is, the torch one is not needed)."""
    top = state if isinstance(state, Mapping) else {}
    kind = kind or _kind(top, state)
    found: dict[str, list[tuple[str, Any]]] = {item: [] for item in ITEMS}
    unloadable: list[tuple[str, Unloadable]] = []
    optimizers: list[str] = []
    for path, v in _walk(state):
        if isinstance(v, Unloadable):
            unloadable.append((path, v))
        elif _is_optimizer(v):
            optimizers.append(path)
            found["optimizer"].append((path, v))
    for path, v in _walk(state):
        key = _name(path.rsplit("/", 1)[-1]) if path else ""
        if _under(path, optimizers) or isinstance(v, Unloadable):
            continue
        if _is_scheduler(v):
            found["scheduler"].append((path, v))
        elif _is_scaler(v) or (key in SCALER_KEYS and isinstance(v, Mapping) and not v):
            found["scaler"].append((path, v))
        elif isinstance(v, Mapping) and isinstance(v.get("bit_generator"), str):
            found["numpy RNG"].append((path, v))
        elif _is_legacy_numpy(v):
            found["numpy RNG"].append((path, v))
        elif _is_python_random(v):
            found["Python random"].append((path, v))
        elif "cuda" in path.lower() and (
                (is_tensor(v) and _dtype(v) == "uint8")
                or (isinstance(v, list | tuple) and v and all(is_tensor(t) for t in v))):
            if not _under(path, [p for p, _ in found["CUDA RNG"]]):
                found["CUDA RNG"].append((path, v))
        elif is_tensor(v) and _dtype(v) == "uint8" and _numel(v) == TORCH_CPU_RNG_BYTES:
            found["torch CPU RNG"].append((path, v))
        elif _is_model(v) and not _under(path, [p for p, _ in found["model"]]):
            found["model"].append((path, v))
        elif key in DATA_KEYS and v is not None and "/" not in path:
            found["data position"].append((path, v))
        elif key == "loops" and isinstance(v, Mapping) and "/" not in path:
            found["data position"].append((path, v))
        elif key in POSITION_INTS and _is_int(v) and "/" not in path:
            found["data position"].append((path, v))
        elif key == "epoch" and _is_int(v) and (
                "/" not in path or _under(path, [p for p, _ in found["data position"]])):
            found["epoch"].append((path, v))
        elif key in STEP_KEYS and _is_int(v) and "/" not in path:
            found["global step"].append((path, v))
    audit = Audit(kind)
    _rows(audit, found, _fp16(state), generator)
    _unloadable(audit, unloadable)
    _flags(audit, top, found)
    return audit


def _kind(top: Mapping[str, Any], state: Any) -> str:
    if not isinstance(state, Mapping):
        return f"torch.save of a {type(state).__name__}"
    if "state_dict" in top and ("optimizer_states" in top or "loops" in top
                                or "pytorch-lightning_version" in top):
        return "Lightning checkpoint"
    if "model" in top and "model_args" in top and "iter_num" in top:
        return "nanoGPT-style checkpoint"
    if _is_optimizer(top):
        return "optimizer state (a torch.optim state_dict alone)"
    return "torch.save dict"


def _where(hits: list[tuple[str, Any]]) -> str:
    return ", ".join(p or "(the whole file)" for p, _ in hits)


def _value(v: Any) -> Any:
    """A one-element tensor or NumPy scalar as a Python number (a scale may be 0.5)."""
    return v.item() if is_tensor(v) else v


def _rows(audit: Audit, found: dict[str, list[tuple[str, Any]]], fp16: bool | None,
          generator: str) -> None:
    def add(item: str, status: str, detail: str = "", need: str = REQUIRED,
            where: str | None = None) -> None:
        audit.rows.append(Row(item, status, _where(found[item]) if where is None else where,
                              detail, need))

    models = found["model"]
    add("model", PRESENT if models else MISSING,
        "; ".join(f"{len(v)} tensors, {sum(_numel(t) for t in v.values()):,} values"
                  for _, v in models))
    opts = found["optimizer"]
    add("optimizer", PRESENT if opts else MISSING,
        "; ".join(f"{len(v['param_groups'])} group(s), state for {len(v['state'])} "
                  "parameter(s)" for _, v in opts))
    if not opts:
        add("optimizer step counts", MISSING, "no optimizer")
    else:
        per = [s for _, o in opts for s in o["state"].values() if isinstance(s, Mapping)]
        with_step = [s for s in per if "step" in s]
        steps = sorted({float(_value(s["step"])) for s in with_step})
        if not per:
            detail = "no per-parameter state yet (no step taken, or plain SGD)"
        else:
            detail = (f"{len(with_step)} of {len(per)} parameters have 'step'"
                      + (f" (= {', '.join(f'{s:g}' for s in steps)})" if steps else ""))
        add("optimizer step counts", PRESENT if len(with_step) == len(per) else INCOMPLETE,
            detail, where=", ".join(f"{p}/state" if p else "state" for p, _ in opts))
    add("scheduler", PRESENT if found["scheduler"] else MISSING,
        "; ".join(f"last_epoch {v['last_epoch']}" for _, v in found["scheduler"]))
    scalers = found["scaler"]
    if scalers:
        live = [v for _, v in scalers if v]
        status = (DISABLED if not live else INCOMPLETE
                  if any("_growth_tracker" not in v and "growth_tracker" not in v for v in live)
                  else PRESENT)
        add("scaler", status, "; ".join(
            f"scale {float(_value(v['scale'])):g}, growth tracker "
            f"{v.get('_growth_tracker', v.get('growth_tracker', 'MISSING'))}" if v
            else "{} (a disabled GradScaler)" for _, v in scalers),
            REQUIRED if fp16 is not False else "if trained in fp16")
    else:
        add("scaler", MISSING if fp16 is not False else NOT_NEEDED,
            "the configuration says fp16" if fp16 else "",
            REQUIRED if fp16 else "if trained in fp16")
    numpy_drops = generator == "numpy"
    add("torch CPU RNG", PRESENT if found["torch CPU RNG"] else
        NOT_NEEDED if numpy_drops else MISSING,
        f"{TORCH_CPU_RNG_BYTES}-byte Mersenne Twister state" if found["torch CPU RNG"] else "",
        "if the run draws from torch" if numpy_drops else REQUIRED)
    add("CUDA RNG", PRESENT if found["CUDA RNG"] else MISSING,
        "; ".join(f"{len(v) if isinstance(v, list | tuple) else 1} device(s)"
                  for _, v in found["CUDA RNG"]), "if trained on CUDA")
    add("numpy RNG", PRESENT if found["numpy RNG"] else MISSING,
        "; ".join("legacy RandomState tuple" if isinstance(v, list | tuple)
                  else f"Generator ({v['bit_generator']})" for _, v in found["numpy RNG"]),
        REQUIRED if numpy_drops else "if the run draws from numpy")
    add("Python random", PRESENT if found["Python random"] else MISSING,
        "random.getstate()" if found["Python random"] else "", "if the run draws from random")
    data = found["data position"]
    add("data position", PRESENT if data else MISSING,
        "; ".join(_data_detail(p, v) for p, v in data))
    epochs = found["epoch"]
    add("epoch", PRESENT if epochs else MISSING,
        ", ".join(str(_value(v)) for _, v in epochs))
    steps = found["global step"]
    add("global step", PRESENT if steps else MISSING,
        ", ".join(f"{p.rsplit('/', 1)[-1]} = {_value(v)}" for p, v in steps))


def _data_detail(path: str, v: Any) -> str:
    if isinstance(v, Mapping) and path == "loops":
        try:
            done = v["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"]
            return f"Lightning fit loop: {done} batches of this epoch completed"
        except (KeyError, TypeError):
            return "Lightning loops"
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {_value(x)}" for k, x in v.items() if _is_int(x)) or "a dict"
    return f"{_value(v)}" if _is_int(v) else type(v).__name__


def _unloadable(audit: Audit, files: list[tuple[str, Unloadable]]) -> None:
    """Items a file not loaded holds (by the names its pickle mentions): UNSAFE rows."""
    for path, u in files:
        key = _name(path.rsplit("/", 1)[-1])
        items = ([ACCELERATE_RNG[n] for n in ACCELERATE_RNG if n in u.names]
                 if key == "random_states" else ["data position"] if key in DATA_KEYS
                 else ["scaler"] if key in SCALER_KEYS else [])
        if key == "custom_checkpoint":  # objects registered for checkpointing: by their keys
            items = ((["epoch"] if "epoch" in u.names else [])
                     + (["data position"] if u.names & {*DATA_KEYS, *POSITION_INTS} else [])
                     + (["global step"] if u.names & set(STEP_KEYS) else []))
        for item in items:
            i = next(n for n, r in enumerate(audit.rows) if r.item == item)
            old = audit.rows[i]
            if old.status in (MISSING, NOT_NEEDED):
                audit.rows[i] = Row(item, UNSAFE, path, u.reason, old.need)
        needs = f" (needs {', '.join(u.needs)})" if u.needs else ""
        audit.flags.append(f"{path}: not loaded: {u.reason}{needs}"
                           + ("" if items else "; what it holds is not audited"))


def _flags(audit: Audit, top: Mapping[str, Any], found: dict[str, list[tuple[str, Any]]]
           ) -> None:
    """The classics, named."""
    missing = [i for i in ("scaler", "torch CPU RNG", "data position")
               if audit.row(i).status == MISSING]
    if audit.kind == "nanoGPT-style checkpoint" and missing:
        audit.flags.append("nanoGPT-style checkpoint (model, optimizer, model_args, iter_num): "
                           f"no {', '.join(missing)}; its resume is not exact (its lr is "
                           "get_lr(iter_num), so a missing scheduler costs nothing there)")
    if any(isinstance(v, list | tuple) for _, v in found["numpy RNG"]):
        audit.flags.append("legacy np.random.get_state() tuple: saved with its array it needs "
                           "pickle (weights_only refuses it); save "
                           "np.random.default_rng(...).bit_generator.state instead")
    if audit.row("scaler").status == INCOMPLETE:
        audit.flags.append("GradScaler state without _growth_tracker: "
                           "GradScaler.load_state_dict raises KeyError; resetting it to 0 "
                           "delays the next growth of the scale")
    if audit.row("optimizer step counts").status == INCOMPLETE:
        audit.flags.append("optimizer state without a per-parameter 'step': torch's Adam "
                           "raises KeyError on the next step; resetting it restarts the bias "
                           "correction")
