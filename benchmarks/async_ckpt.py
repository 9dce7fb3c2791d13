"""Step-time cost of a sharded checkpoint, saved synchronously against asynchronously:
`train --world-size 2 --model gpt` (the compact GPT, AdamW, cosine, fp32, 24 rows a global
batch) on 2 gloo ranks on the CPU, a save every K steps; `--parallel fsdp`: the same GPT
under FSDP2 (torch_impl/fsdp_gpt.py: the state is get_state_dict's DTensor shards).

    python benchmarks/async_ckpt.py [--steps 48] [--every 4] [--repeats 5] [--parallel fsdp]
                                    [--write]

Each repeat launches the two modes one after the other (sync, then async, in one launch of
2 processes): the same run, saving every K steps either with torch_impl.sharded_ckpt's
save_sharded (dcp.save, then the commit: the step waits for all of it) or with
torch_impl.async_ckpt.AsyncSaver (the step waits for the staging, and for the previous
save's commit if it has not landed; the write and the commit overlap the next steps). A
step's time is rank 0's wall time (time.perf_counter) from fetching its batch to the end
of its save call, if it saves. Reported per mode, each the median over the repeats of the
per-repeat value: the median step time of the steps that save, of the steps that do not
(the background write competes with them for the machine's cores), and the mean step time
over the run (the amortized cost), with the ratio sync / async of each. `--write` stores
the result and one async repeat's event timeline (every rank's compute, staging, write and
commit) in docs/data/ddp_async.json, which docs/distributed.md's picture draws (DDP's
only: --write with --parallel fsdp is refused). Never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the ranks import this module as benchmarks.async_ckpt

import torch  # noqa: E402

from common.train_config import TrainConfig  # noqa: E402
from common.train_loop import batches  # noqa: E402
from torch_impl import ddp_gpt, fsdp_gpt, fsdp_gpt_ckpt, loss_scaling  # noqa: E402
from torch_impl import sharded_ckpt as sc  # noqa: E402
from torch_impl.async_ckpt import AsyncSaver  # noqa: E402
from torch_impl.train_models import batch_of  # noqa: E402

OUT = ROOT / "docs" / "data" / "ddp_async.json"
MODES = ("sync", "async")


def config(steps: int) -> TrainConfig:
    """The GPT of `train --world-size 2 --model gpt` (fp32, cosine over the run)."""
    return TrainConfig(seed=0, model="gpt", precision="fp32", optimizer="AdamW",
                       schedule="cosine", horizon=steps, batch_size=24)


def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """One rank of one mode's run: the step times and (async) the saver's events."""
    ws, c = job["world_size"], TrainConfig(**job["config"])
    fsdp = job.get("parallel") == "fsdp"
    rep: Any = fsdp_gpt.replica(c, group) if fsdp else ddp_gpt.replica(c, group)
    scaler = loss_scaling.make_scaler(c.precision, "cpu")
    saver = AsyncSaver(group, rank) if job["mode"] == "async" else None
    data = batches(c, rep.parts.loader, batch_of)
    times, events = [], []
    for step in range(1, job["steps"] + 1):
        t0 = time.perf_counter()
        m0 = time.monotonic()
        x, y = next(data)
        record = (fsdp_gpt.fsdp_step(rep, x, y, rank=rank, world_size=ws) if fsdp else
                  ddp_gpt.ddp_step(rep, scaler, x, y, rank=rank, world_size=ws))
        if not record.skipped:
            rep.scheduler.step()
        events.append(("compute", step, m0, time.monotonic()))
        if step % job["every"] == 0:
            state = (fsdp_gpt_ckpt.rank_state(rep, torch.default_generator, step, rank)
                     if fsdp else sc.rank_state(rep, scaler, torch.default_generator, step, rank))
            if saver is not None:
                saver.save(job["directory"], step, state)
            else:
                m1 = time.monotonic()
                sc.save_sharded(job["directory"], step, state, rank, group)
                events.append(("save", step, m1, time.monotonic()))
        times.append(time.perf_counter() - t0)
    if saver is not None:
        saver.close()
        events += saver.events
    return {"times": times, "events": events}


def _summary(times: list[float], every: int) -> dict[str, float]:
    saving = [t for i, t in enumerate(times, 1) if i % every == 0]
    other = [t for i, t in enumerate(times, 1) if i % every]
    return {"saving_median_s": statistics.median(saving),
            "other_median_s": statistics.median(other),
            "mean_s": statistics.fmean(times)}


def measure(steps: int, every: int, repeats: int, parallel: str = "ddp") -> dict[str, Any]:
    import ranks

    per: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    timeline: list[list] = []
    with tempfile.TemporaryDirectory(prefix="mirrortrain-async-bench-") as tmp:
        for r in range(repeats):
            jobs = [{"kind": "bench", "runner": "benchmarks.async_ckpt", "mode": m,
                     "config": config(steps).to_dict(), "steps": steps, "every": every,
                     "world_size": 2, "directory": str(Path(tmp) / f"{r}-{m}"),
                     "parallel": parallel}
                    for m in MODES]
            results = ranks.launch(jobs, 2, timeout=600.0)
            for i, m in enumerate(MODES):
                per[m].append(_summary(results[0][i]["times"], every))
            timeline = [results[k][1]["events"] for k in range(2)]
    keys = ("saving_median_s", "other_median_s", "mean_s")
    result = {m: {k: statistics.median(s[k] for s in per[m]) for k in keys} for m in MODES}
    result["ratio_sync_over_async"] = {k: result["sync"][k] / result["async"][k] for k in keys}
    t0 = min(e[2] for rank in timeline for e in rank)
    return {"steps": steps, "every": every, "repeats": repeats, "world_size": 2,
            "parallel": parallel,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
            "torch": torch.__version__, **result,
            "timeline": [[[w, s, a - t0, b - t0] for w, s, a, b in rank] for rank in timeline]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                   help="the GPT under DDP (default) or FSDP2")
    p.add_argument("--write", action="store_true", help=f"store the result in {OUT}")
    args = p.parse_args()
    if args.write and args.parallel != "ddp":
        p.error(f"--write: {OUT.name} holds the DDP run's timeline (--parallel ddp)")
    r = measure(args.steps, args.every, args.repeats, args.parallel)
    print(f"GPT ({args.parallel}), 2 gloo ranks on the CPU, {args.steps} steps, a save every "
          f"{args.every}, median of {args.repeats} repeats (rank 0's step times, ms)")
    print(f"{'':24}{'sync':>10}{'async':>10}{'sync/async':>12}")
    for key, name in (("saving_median_s", "median, saving steps"),
                      ("other_median_s", "median, other steps"), ("mean_s", "mean, all steps")):
        print(f"{name:24}{1e3 * r['sync'][key]:>10.2f}{1e3 * r['async'][key]:>10.2f}"
              f"{r['ratio_sync_over_async'][key]:>12.2f}")
    if args.write:
        OUT.write_text(json.dumps(r, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
