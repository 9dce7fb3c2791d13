"""Reading what `python -m parity audit FILE` is given, safely, into one object tree for
parity/lab/audit_recognize.py: a torch.save file (a dict, a Lightning `.ckpt`, an optimizer's
state_dict alone), a `.safetensors` file alone (weights only), a Hugging Face Trainer
`checkpoint-<step>/` folder (parity/lab/audit_hf.py), an Accelerate `save_state` folder
(audit_accelerate.py) or a torch.distributed.checkpoint folder or shard file
(audit_dcp.py); this project's own checkpoints are recognised before these, by
parity/lab/audit_own.py. A folder is taken for one layout only by files that layout alone
writes; a folder of neither, or of both, is an "unknown layout" listing what it holds.

Nothing here runs a pickle. torch.save files go through parity.lab.your_trainer.audit.load_safely
(weights_only=True); a pickle that is not a torch.save file is read by parity/lab/
audit_pickle.py (its opcodes parsed, or a restricted unpickler), never run.
`model.safetensors` is read from its header alone (8 bytes little-endian length N,
then N bytes of JSON {name: {"dtype", "shape", "data_offsets"}}): no safetensors library.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from parity.lab import audit_dcp as dcp
from parity.lab import audit_lightning as lightning
from parity.lab import audit_nanogpt as nanogpt
from parity.lab.audit_accelerate import audit_accelerate, is_accelerate_folder
from parity.lab.audit_files import safetensors_header, torch_file
from parity.lab.audit_own import own
from parity.lab.audit_recognize import Audit, AuditInputError, Unloadable, recognize

SHOWN = 8  # names an unknown folder's message lists


def audit_path(text: str) -> Audit:
    """The Audit of the file or folder `text`; AuditInputError when it cannot be read. This
    project's own formats are recognised first (parity/lab/audit_own.py), then the foreign
    layouts; a folder of none of them is an "unknown layout", listing what it holds."""
    path = Path(text)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise AuditInputError(f"{text}: {e.strerror.lower()}") from None
    if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
        raise AuditInputError(f"{text}: not a regular file or a folder")
    try:
        mine = own(path)
    except OSError as e:
        raise AuditInputError(f"{text}: cannot be read ({e.strerror})") from None
    if mine is not None:
        return mine
    if stat.S_ISDIR(mode):
        return _folder(path)
    if path.suffix == ".distcp":
        return dcp.shard_file(path)
    if path.suffix == ".safetensors":
        return _weights_only(path)
    value = torch_file(path)
    if isinstance(value, Unloadable):
        audit = Audit("torch.save file", refused=value.reason, needs=value.needs)
        if any("numpy" in g for g in value.needs):
            audit.flags.append("a numpy global: the usual cause is a legacy "
                               "np.random.get_state() (an ndarray inside a tuple); save "
                               "np.random.default_rng(...).bit_generator.state instead")
        return audit
    audit = recognize(value)
    if audit.kind == nanogpt.KIND:
        audit = nanogpt.adjust(audit, value)
    if audit.kind == lightning.KIND:
        audit = lightning.adjust(audit, value)
    if audit.kind.startswith("optimizer state"):
        per = [s for s in value["state"].values() if isinstance(s, dict)]
        keys = sorted({k for s in per for k in s if k != "step"})
        steps = sorted({float(s["step"]) for s in per if "step" in s})
        audit.flags.append(
            f"an optimizer's state alone, not a model: {', '.join(keys) or 'no moments'} for "
            f"{len(per)} parameter(s), step {', '.join(f'{x:g}' for x in steps) or 'none'}; "
            "the weights, scheduler, RNG and data position are in other files, if anywhere")
    return audit


def _weights_only(path: Path) -> Audit:
    """A .safetensors file alone: tensors by its header, and nothing else a resume needs."""
    header = safetensors_header(path)
    if not header:
        raise AuditInputError(f"{path}: a .safetensors file holding no tensors")
    audit = recognize({path.name: header}, "safetensors file: weights only")
    audit.flags.append("weights only: a .safetensors file holds named tensors (read from its "
                       "header) and no optimizer, scheduler, scaler, RNG or data position")
    return audit


def _folder(path: Path) -> Audit:
    """A foreign folder: a DCP folder (parity/lab/audit_dcp.py), a Hugging Face Trainer
    checkpoint-<step> folder (audit_hf.py) or an Accelerate save_state folder
    (audit_accelerate.py), each by the files only it writes; else an unknown layout."""
    from parity.lab.audit_hf import MARKERS, audit_trainer, is_trainer_folder

    names = sorted(p.name for p in path.iterdir())
    if dcp.METADATA in names or any(dcp.SHARD.fullmatch(n) for n in names):
        return dcp.audit_dcp(path)
    trainer = is_trainer_folder(names)
    accelerate = is_accelerate_folder(names)
    if trainer == accelerate:
        shown = ", ".join(names[:SHOWN]) + (f", ... ({len(names)} in all)"
                                            if len(names) > SHOWN else "")
        raise AuditInputError(
            f"{path}: unknown layout: it holds {shown or 'nothing'}"
            + ("; files of both Trainer and Accelerate" if trainer else "")
            + "; audit reads this project's run, step and checkpoint files, a Hugging Face "
            f"Trainer checkpoint folder ({', '.join(MARKERS)}, rng_state.pth), an Accelerate "
            "save_state folder (optimizer.bin, scheduler.bin, random_states_0.pkl), a "
            "torch.distributed.checkpoint folder (.metadata, __0_0.distcp) or one "
            "torch.save file")
    return audit_trainer(path) if trainer else audit_accelerate(path)
