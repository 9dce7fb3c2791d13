"""The compact transformer under FSDP2 with AdamW: every block and the root `fully_shard`ed,
torch.optim.AdamW on the sharded DTensors, the run's schedule; one rank's step, its sharded
state through torch.distributed.checkpoint.state_dict, and the rank's side of
`train --world-size N --model gpt --parallel fsdp`. See reference/fsdp_gpt.py for the step
over simulated ranks and the run; reference/fsdp.py for the arithmetic (NOTE [ FSDP2's
shards ], NOTE [ FSDP2's all-gather ], NOTE [ FSDP2's reduce-scatter on gloo ]).

What the engine does that the reference states:
- precision "bf16" ("fp16"): MixedPrecisionPolicy(param_dtype=bfloat16 (float16),
  reduce_dtype=float32): each module all-gathers its shards cast to param_dtype and runs its
  forward and backward on them (every op in it: no autocast); the local gradients are
  param_dtype, copied into a float32 buffer and reduce-scattered (ReduceOp.AVG). "fp32": no
  policy, float32 throughout. fp16 is bf16's policy with float16, not the one-process run's
  autocast (float32 weights, float16 matmuls): FSDP2 casts what it gathers, and the float16
  gradients it then reduces are what a scaler must keep from underflow and watch for
  overflow; the reduce stays float32, so the sum of ws scaled gradients cannot overflow.
- A scaled precision (NOTE [ Scaled GEMMs under FSDP2 ] in reference/fsdp_gpt.py): no
  policy, so the all-gather and the reduce-scatter are float32's; FSDP2 registers the
  unsharded weight in each ScaledLinear before its block's forward, so its _ScaledMM casts
  (and saves for the backward, re-gathered there) the full W; fp8-delayed's amaxes are
  reduced on the FSDP group after the backward (its reduce-scatters done), as the DDP run
  does (torch_impl/ddp_gpt.py's defer_scale_updates, amax_vector, reduce_amax,
  update_scales); nvfp4's bits are the rank's own (common.ddp_bits.rank_bits).
- fp16's scaler is ShardedGradScaler (make_scaler): unscale_ runs
  `_amp_foreach_non_finite_check_and_unscale_` on this rank's DTensor gradients (their local
  rows times f32(1/S)), whose DTensor dispatch already takes found_inf as Partial("max") and
  all-reduces it; unscale_ then all-reduces it again with ReduceOp.SUM (NOTE [ found_inf
  under FSDP2 ] in reference/fsdp_gpt.py). Its CPU update is its own Python rule, the
  same bits as the reference's for power-of-two factors. Its scale and growth tracker are
  saved beside the replicated entries; a skipped step does not step the schedule.
- --recompute is the one-process run's (torch_impl/recompute_gpt.py): torch.utils.checkpoint
  (non-reentrant) around segments of fully_shard'ed blocks, so a recomputed block's
  pre-forward hook all-gathers its shards again in the backward; --loader-workers K gives
  each rank K workers (NOTE [ Loader workers of a rank ] in torch_impl/ddp_train.py).
- The fully_shard modules are the blocks (each its 12 parameters) and the root (wte, wpe,
  ln_f, lm_head): reference.fsdp_gpt.groups. The root's pre-forward hook runs first, so the
  root's parameters gather before the first block's.
- AdamW (for-loop path on CPU) steps each DTensor's local rows: elementwise, as on a plain
  tensor; the schedule is torch.optim.lr_scheduler's (torch_impl/train.py's choice).
- The rank's state (torch_impl/fsdp_gpt_ckpt.py): get_state_dict (sharded: every model
  entry and AdamW buffer a DTensor of this rank's rows) flattened to the table of
  torch_impl/sharded_ckpt.py keyed by the parameter's index, and DCP writes each rank's
  rows; set_state_dict puts a loaded one back, at any world size (DCP reshards the
  DTensors: NOTE [ Resharding an FSDP checkpoint ] in reference/fsdp_gpt_ckpt.py).
- --async-save: each rank's AsyncSaver (torch_impl/async_ckpt.py, the DDP run's) stages
  that table and returns: BlockingAsyncStager copies every DTensor's local rows into fresh
  CPU memory (a DTensor of the same mesh and placement: DCP still writes them at their
  global offsets), since get_state_dict's DTensors alias the live shards that the next
  AdamW step overwrites in place, and AdamW's step counts with them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from ckpt import commit as ckc
from ckpt import commit_policy
from ckpt.policy import due
from common.ddp_bits import rank_bits
from common.ddp_gpt_state import gpt_rank_digest
from common.fp8_train import SCALED_PRECISIONS
from common.recipes_train import BitStream
from common.train_config import OPTIMIZERS, TrainConfig
from common.train_loop import RanksResult, batches
from torch_impl import ddp_gpt, loss_scaling
from torch_impl import sharded_ckpt as sc
from torch_impl.async_ckpt import AsyncSaver, save_step
from torch_impl.ddp import shard
from torch_impl.fp8_train import ScaledLinear
from torch_impl.fsdp_gpt_ckpt import digest_state, load_ranks, rank_state
from torch_impl.state_digest import as_array
from torch_impl.train import _make_scheduler
from torch_impl.train_models import batch_of, build

PRECISIONS = ("fp32", "bf16", "fp16", *SCALED_PRECISIONS)  # not bf16-sr (reference NOTE)
PAYLOAD = sc.PAYLOAD
PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def policy(precision: str) -> MixedPrecisionPolicy | None:
    """The MixedPrecisionPolicy of a precision: param_dtype bf16's or fp16's with a float32
    reduce, or none (fp32 and the scaled precisions: float32 all-gathers)."""
    if precision not in PRECISIONS:
        raise ValueError(f"fsdp_gpt: precision one of {PRECISIONS}, got {precision!r}")
    if precision not in PARAM_DTYPES:
        return None
    return MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[precision], reduce_dtype=torch.float32)


def make_scaler(c: TrainConfig, group: Any) -> ShardedGradScaler:
    """ShardedGradScaler on `group`, enabled for fp16 only (disabled: scale 1, tracker 0,
    step is optimizer.step): unscale_ multiplies this rank's gradient rows by f32(1/S) and
    all-reduces found_inf (ReduceOp.SUM) before step reads it."""
    return ShardedGradScaler("cpu", init_scale=c.init_scale, growth_interval=c.growth_interval,
                             enabled=c.precision == "fp16", process_group=group)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a DTensor (a plain tensor as it is), cloned."""
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


@dataclass
class Replica:
    """One rank's side of an FSDP2 run of the GPT: its config, model parts (the model
    fully_shard'ed), parameter names, initial full parameters, AdamW, the schedule and, if
    recorded, each step's gathered parameters and local gradients by parameter index;
    `group`; `bits`: the rank's BitStream (nvfp4); `delayed`: the fp8-delayed layers and
    `amax`, this rank's amax vector of the last step before the reduction."""

    config: TrainConfig
    parts: Any
    names: list[str]
    initial: list[torch.Tensor]
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: ShardedGradScaler
    gathered: dict[int, torch.Tensor] = field(default_factory=dict)
    local: dict[int, torch.Tensor] = field(default_factory=dict)
    group: Any = None
    bits: BitStream | None = None
    delayed: list[ScaledLinear] = field(default_factory=list)
    amax: torch.Tensor | None = None

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return list(self.parts.model.parameters())


def replica(config: TrainConfig, group: Any, record: bool = False) -> Replica:
    """The GPT of `config` (its seed: the same full weights on every rank), every block and
    then the root fully_shard'ed on `group` under policy(precision), AdamW and the schedule;
    `record`: hooks keep each step's all-gathered parameters and local gradients."""
    c = config
    if c.model != "gpt" or c.optimizer != "AdamW":
        raise ValueError(f"fsdp_gpt.replica: model 'gpt', optimizer 'AdamW'; got "
                         f"{c.model!r}, {c.optimizer!r}")
    mp = policy(c.precision)
    bits = rank_bits(c.seed, c.precision, dist.get_rank(group))
    parts = build(c, torch.Generator().manual_seed(c.seed), torch.device("cpu"),
                  torch.Generator(), bits)
    model = parts.model
    names = [n for n, _ in model.named_parameters()]
    initial = [p.detach().clone() for p in model.parameters()]
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
    kwargs = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for block in model.transformer.h:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr, **OPTIMIZERS["AdamW"])
    rep = Replica(c, parts, names, initial, optimizer, _make_scheduler(optimizer, c),
                  make_scaler(c, group), group=group, bits=bits,
                  delayed=ddp_gpt.defer_scale_updates(model))
    if record:
        index = {n: i for i, n in enumerate(names)}
        modules = [("", model)] + [(f"transformer.h.{k}.", b)
                                   for k, b in enumerate(model.transformer.h)]
        for prefix, module in modules:
            mine = [index[n] for n in names if n.startswith(prefix) and
                    (prefix or not n.startswith("transformer.h."))]
            module.register_forward_pre_hook(_recorder(rep, mine))
    return rep


def _recorder(rep: Replica, indices: list[int]) -> Callable[..., None]:
    """A forward pre-hook (after FSDP's all-gather): the unsharded parameters, and a tensor
    hook on each for its local gradient (before FSDP's reduce-scatter)."""
    def hook(module: torch.nn.Module, args: Any) -> None:
        for i in indices:
            p = rep.parts.model.get_parameter(rep.names[i])
            rep.gathered[i] = p.detach().clone()
            p.register_hook(lambda g, i=i: rep.local.__setitem__(i, g.detach().clone()))
    return hook


@dataclass
class StepRecord:
    """One FSDP2 step of the GPT on this rank: its rows (x, y), the sharded gradients
    [param] (this rank's rows, float32, still scaled), its shard's loss (float32), the scale
    the step used, the found_inf step read (summed over the ranks), whether it skipped."""

    rows: tuple[torch.Tensor, torch.Tensor]
    grads: list[torch.Tensor]
    loss: torch.Tensor
    scale: float = 1.0
    found_inf: float = 0.0
    skipped: bool = False


def fsdp_step(rep: Replica, x: torch.Tensor, y: torch.Tensor, *, rank: int,
              world_size: int) -> StepRecord:
    """One FSDP2 step of the GPT on rank `rank`, which trains on shard(x, rank, ws): zero_grad,
    the forward (each module's all-gather before it), the float32 next-token loss of its
    rows, backward of S * loss (each module's reduce-scatter after it), then the scaler's
    unscale_ of this rank's rows (found_inf all-reduced), AdamW on the shards unless inf or
    NaN, update. The run steps the schedule after it unless it skipped
    (reference.fsdp_gpt.fsdp_step)."""
    scaler = rep.scaler
    rep.optimizer.zero_grad(set_to_none=True)
    # (B/ws, T) token ids; contiguous, as NextTokenLoss's view(-1) of the targets needs
    xr, yr = (shard(t, rank, world_size).contiguous() for t in (x, y))
    logits, _ = rep.parts.model(xr)  # (B/ws, T, V), param_dtype
    loss = rep.parts.loss_fn((logits.float(), None), yr)
    scaler.scale(loss).backward()  # the reduce-scatters run here, module by module
    if rep.delayed:  # NOTE [ Scaled GEMMs under FSDP2 ] 3
        rep.amax = ddp_gpt.amax_vector(rep.delayed)
        ddp_gpt.update_scales(rep.delayed, ddp_gpt.reduce_amax(rep.amax.clone(), rep.group))
    grads = [_local(p.grad) for p in rep.params]
    record = StepRecord((xr, yr), grads, loss.detach().clone(), scaler.get_scale())
    with warnings.catch_warnings():  # found_inf is (1,): the DTensor dispatch says so
        warnings.filterwarnings("ignore", "Found a non-scalar tensor with numel=1",
                                UserWarning)
        scaler.unscale_(rep.optimizer)  # this rank's rows; NOTE [ found_inf under FSDP2 ]
    if scaler.is_enabled():
        record.found_inf = sum(v.item() for v in
                               scaler._found_inf_per_device(rep.optimizer).values())
    scaler.step(rep.optimizer)
    record.skipped = loss_scaling.step_skipped(scaler, rep.optimizer)
    scaler.update()
    return record


def gpt_job(config: TrainConfig, steps: int, world_size: int) -> dict[str, Any]:
    """`steps` FSDP2 steps of `config`'s GPT, each recorded (parity/drivers/fsdp_gpt.py)."""
    policy(config.precision)
    if (config.model != "gpt" or config.dropout != 0.0 or config.batch_size % world_size
            or config.recompute != "none"):  # the recorder hooks the first forward's only
        raise ValueError("fsdp_gpt.gpt_job: the GPT, dropout 0, no recomputation, a batch "
                         "that splits evenly")
    return {"kind": "fsdp-gpt", "runner": __name__, "config": config.to_dict(),
            "steps": steps, "world_size": world_size}


def train_job(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
              every: int, *, keep: int, resume: int | None, log: str | Path,
              loader_workers: int = 0, async_save: str | None = None) -> dict[str, Any]:
    """The job every rank of `train --parallel fsdp` runs (run, below); `loader_workers`:
    each rank's DataLoader workers (NOTE [ Loader workers of a rank ] in
    torch_impl/ddp_train.py); `async_save` (a mode of torch_impl.async_ckpt.MODES): the
    checkpoints saved in the background (NOTE [ An async save commits after its data is
    durable ] in reference/async_ckpt.py)."""
    policy(config.precision)
    return {"kind": "fsdp-gpt-train", "runner": __name__,
            "config": config.to_dict(), "steps": steps, "world_size": world_size,
            "directory": str(directory), "every": every, "keep": keep, "resume": resume,
            "log": str(log), "loader_workers": loader_workers, "async_save": async_save}


# -- How a rank runs this: the drivers' job and the command's (harness) -----------------------


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """One rank of a job: "fsdp-gpt" (every step recorded: the drivers') or
    "fsdp-gpt-train" (the command: resume if asked, train, checkpoint, log)."""
    from torch_impl.ddp_train import _ASYNC_TIMEOUT, _name, _orphaned, _workers

    ws, steps = job["world_size"], job["steps"]
    c = TrainConfig(**{k: tuple(v) if k == "sizes" else v for k, v in job["config"].items()})
    record = job["kind"] == "fsdp-gpt"
    if not record:
        _name(rank)
    rep = replica(c, group, record=record)
    generator = torch.default_generator  # nn.Dropout's: this rank's stream
    torch.manual_seed(ckc.rank_seed(c.seed, rank, 0))
    step, skipped = 0, 0
    if not record and job["resume"] is not None:  # resharded if ws differs
        commit, step, skipped = load_ranks(job["directory"], rep, generator, rank, ws, group)
        if commit.step != job["resume"]:
            raise RuntimeError(f"{job['directory']}: its newest commit is step {commit.step}, "
                               f"the command chose step {job['resume']} (changed since?)")
    if not record and job.get("loader_workers"):
        _workers(rep, job["loader_workers"])  # type: ignore[arg-type]
    forwards = [0]  # the blocks' forwards, recomputed ones included (the tests' guard)
    for block in rep.parts.model.transformer.h:
        block.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    mode = None if record else job.get("async_save")
    saver = None if mode is None else AsyncSaver(group, rank, mode, timeout=_ASYNC_TIMEOUT)
    log = open(job["log"], "a", encoding="utf-8") if rank == 0 and not record else None
    data = batches(c, rep.parts.loader, batch_of)  # from the sampler's (restored) position
    out: list[dict[str, Any]] = []
    try:
        while step < steps:
            if not record and _orphaned():
                raise RuntimeError("the process that launched this rank is gone")
            x, y = next(data)
            lr = rep.optimizer.param_groups[0]["lr"]
            rep.gathered.clear()
            rep.local.clear()
            rec = fsdp_step(rep, x, y, rank=rank, world_size=ws)
            if not rec.skipped:  # the schedule counts applied updates
                rep.scheduler.step()
            step, skipped = step + 1, skipped + int(rec.skipped)
            if record:
                n = len(rep.names)
                out.append({"gathered": [rep.gathered[i] for i in range(n)],
                            "local": [rep.local[i] for i in range(n)], "grads": rec.grads,
                            "params": [_local(p) for p in rep.params], "loss": rec.loss,
                            "lr": lr, "scale": rec.scale, "found_inf": rec.found_inf,
                            "skipped": rec.skipped, "next_scale": rep.scaler.get_scale(),
                            "tracker": rep.scaler._get_growth_tracker(), "amax": rep.amax,
                            "buffers": {n: b.detach().clone() for n, b in
                                        rep.parts.model.named_buffers()}})
                continue
            mean = rec.loss.double()
            dist.all_reduce(mean, group=group)  # the global batch's loss: the shards' mean
            if log is not None:
                log.write(f"step {step} loss {float(mean) / ws:.6g} scale {rec.scale:g} "
                          f"skipped {int(rec.skipped)} (total {skipped})\n")
                log.flush()
            if not due(step, steps, job["every"]):
                continue
            state = rank_state(rep, generator, step, rank, skipped=skipped)  # live DTensors
            config = {**job["config"], "parallel": "fsdp"}
            save_step(job["directory"], step, state, rank, group, saver=saver, config=config,
                      keep=job["keep"])  # with a saver: staged (copied), written meanwhile
        if saver is not None:
            saver.close()  # the last save committed (or its error raised) before the digest
    finally:
        if log is not None:
            log.close()
        close = getattr(rep.parts.loader, "close", None)
        if close is not None:  # a WorkerLoader's processes end here
            close()
    if record:
        state = {k: _local(v) for k, v in rank_state(rep, generator, step, rank).items()
                 if k.startswith(("optim/", "bits"))}
        return {"initial": rep.initial, "steps": out, "state": state}
    final = digest_state(rep, generator, step, rank)
    return {"step": step, "skipped": skipped, "forwards": forwards[0],
            "loader": type(rep.parts.loader).__name__, "digest": gpt_rank_digest(final, as_array),
            "bits": None if rep.bits is None else ddp_gpt.bits_tensor(rep.bits.state())}


def train(config: TrainConfig, steps: int, world_size: int, directory: str | Path,
          every: int, *, keep: int, start: commit_policy.Start,
          log: Callable[[str], None], collective_timeout: float = 30.0,
          timeout: float = math.inf, loader_workers: int = 0,
          async_save: str | None = None) -> RanksResult:
    """`train --world-size N --model gpt --parallel fsdp --impl torch`: N gloo ranks run
    train_job (reference/fsdp_gpt.py's train is the run); ranks.DDPError if one fails."""
    from torch_impl.ddp_train import _run_ranks

    return _run_ranks(lambda rank0_log: train_job(
        config, steps, world_size, directory, every, keep=keep,
        resume=None if start.record is None else start.record.step, log=rank0_log,
        loader_workers=loader_workers, async_save=async_save),
        world_size, log, "fsdp", timeout=timeout, collective_timeout=collective_timeout)
