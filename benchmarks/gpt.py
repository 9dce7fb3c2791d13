"""The transformer's training step, reference vs torch, and the learning control.

    python benchmarks/gpt.py [--repeats 15] [--write]      step times, 1 and 2 threads
    python benchmarks/gpt.py --learn [--write]             the copy-task learning curves
    python benchmarks/gpt.py --free [--write]              free-running autocast differences

Step: zero_grad, forward with targets, backward, AdamW step, float32, batch 32, on the tiny
default config (vocab 12, block 16, 2 layers, 2 heads, width 32) and on a 4x larger one
(width 64, 4 heads, 4x the parameters per block; 4 layers, block 32).

Method: each thread count runs in its own worker process, because NumPy's BLAS reads its
thread count (OPENBLAS_NUM_THREADS) once, when it loads; the worker also sets
torch.set_num_threads. Wall time (time.perf_counter: two threads must be seen to help) of
one step; one warm-up round, then `repeats` rounds, each running every (config, tree) once in
an order shuffled per round; the reference/torch ratio is taken within a round and
summarized by the median and min-max over rounds. Wall time on a shared machine is noisy:
compare the ratios, not the seconds. Each step is split into its phases (forward with the
loss, backward, optimizer step with zero_grad), timed and ratioed the same way, to say in which
phase the reference loses; the worker also profiles the reference's step on the larger config
(cProfile, tottime per function) to say on what.

Held bytes: the tape's held bytes after a forward with targets and torch's hook
measurement (distinct storages) on each config: equal (claim gpt.saved_tensors).

--learn: both trees train the tiny config on the copy task for 400 steps on one thread
(parity/drivers/gpt_learn.py, CONTROL_STEPS), held-out copy accuracy every 25 steps.
--free: the whole model under bf16 and fp16 autocast, each tree running itself: where the two
runs part and how far apart they end (parity/drivers/gpt_free.py, end_differences).
--write saves docs/data/gpt_bench.json, gpt_learning.json or gpt_autocast_free.json.
"""

from __future__ import annotations

import os
import sys

if "--threads" in sys.argv:  # a worker: the BLAS thread count before NumPy loads
    _n = sys.argv[sys.argv.index("--threads") + 1]
    for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[_var] = _n
elif "--learn" in sys.argv:
    for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[_var] = "1"

import argparse
import cProfile
import dataclasses
import json
import platform
import pstats
import random
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from parity.drivers import gpt as dg  # noqa: E402
from parity.drivers import gpt_learn as gl  # noqa: E402
from reference import optim as roptim  # noqa: E402
from torch_impl import gpt as tgpt  # noqa: E402

BENCH_JSON = ROOT / "docs" / "data" / "gpt_bench.json"
LEARN_JSON = ROOT / "docs" / "data" / "gpt_learning.json"
FREE_JSON = ROOT / "docs" / "data" / "gpt_autocast_free.json"
BATCH = 32
CONFIGS = {
    "tiny": dg.GPTConfig(),
    "4x": dg.GPTConfig(block_size=32, n_layer=4, n_head=4, n_embd=64),
}
METHOD = ("wall time (perf_counter) of one training step (forward, backward, AdamW), float32, "
          f"batch {BATCH}; each thread count in its own process (BLAS threads fixed at load); "
          "rounds interleaved and shuffled; ratio reference/torch within a round; median and "
          "min-max over rounds")


def _steppers(config: dg.GPTConfig) -> dict:
    """One training step per tree, returning its phases' wall times (forward with the loss,
    backward, optimizer step; zero_grad counted with the optimizer)."""
    ref, twin = dg.make_pair(config, np.float32, 0)
    idx, targets = dg.tokens(config, BATCH, config.block_size, 1)
    t_idx, t_tgt = torch.from_numpy(idx), torch.from_numpy(targets)
    ropt, topt = roptim.AdamW(ref.parameters(), lr=1e-3), torch.optim.AdamW(twin.parameters(),
                                                                            lr=1e-3)

    def ref_step() -> list[float]:
        t0 = time.perf_counter()
        ref.forward(idx, targets)
        t1 = time.perf_counter()
        ref.backward()
        t2 = time.perf_counter()
        ropt.step()
        ref.zero_grad()
        return [t1 - t0, t2 - t1, time.perf_counter() - t2]

    def torch_step() -> list[float]:
        t0 = time.perf_counter()
        loss = twin(t_idx, t_tgt)[1]
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        topt.step()
        topt.zero_grad()
        return [t1 - t0, t2 - t1, time.perf_counter() - t2]

    return {"reference": ref_step, "torch": torch_step}


PHASES = ("forward", "backward", "optimizer")
PROFILE_STEPS = 10


def _where(key: tuple) -> str:
    """A cProfile key as 'path:Class.function' relative to the repository (the class: the
    nearest less-indented `class` line above the def; built-ins as they are)."""
    path = Path(key[0])
    try:
        rel = path.resolve().relative_to(ROOT)
        source = path.read_text(encoding="utf-8")
    except (ValueError, OSError):
        return f"{path.name}:{key[2]}" if key[0] != "~" else key[2]
    lines = source.splitlines()[:key[1]]
    indent = len(lines[-1]) - len(lines[-1].lstrip()) if lines else 0
    for line in reversed(lines[:-1]):
        if line.lstrip().startswith("class ") and len(line) - len(line.lstrip()) < indent:
            return f"{rel}:{line.split()[1].split('(')[0].rstrip(':')}.{key[2]}"
    return f"{rel}:{key[2]}"


def worker(threads: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    steps = {name: _steppers(cfg) for name, cfg in CONFIGS.items()}
    jobs = [(c, t) for c in CONFIGS for t in ("reference", "torch")]
    rounds = []
    for r in range(repeats + 1):
        order = jobs[:]
        random.Random(r).shuffle(order)
        times = {}
        for c, t in order:
            phases = steps[c][t]()
            times[f"{c}/{t}"] = sum(phases)
            times.update({f"{c}/{t}/{p}": v for p, v in zip(PHASES, phases, strict=True)})
        if r:  # round 0 warms up
            rounds.append(times)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(PROFILE_STEPS):
        steps["4x"]["reference"]()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    top = sorted(((v[2], _where(k)) for k, v in stats.items()), reverse=True)[:10]
    return {"rounds": rounds, "profile": [[name, round(t / total, 3)] for t, name in top]}


def summarize(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def held_bytes() -> dict:
    out = {}
    for name, cfg in CONFIGS.items():
        ref, twin = dg.make_pair(cfg, np.float32, 0)
        idx, targets = dg.tokens(cfg, BATCH, cfg.block_size, 1)
        ref.forward(idx, targets)
        _, measured = tgpt.measure_saved(twin, torch.from_numpy(idx), torch.from_numpy(targets))
        out[name] = {"tape": ref.held_bytes(), "hooks": measured}
    return out


def sdpa_differences() -> dict:
    """What attention='sdpa' changes on the tiny config, batch 4: the saved tensors of block
    0's core, the bytes held, and the FLOPs FlopCounterMode counts (forward + backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    ref, _ = dg.make_pair(CONFIGS["tiny"], np.float32, 0)
    idx, targets = dg.tokens(CONFIGS["tiny"], 4, 16, 1)
    for attention in ("explicit", "sdpa"):
        cfg = dataclasses.replace(CONFIGS["tiny"], attention=attention)
        twin = tgpt.GPT(cfg, generator=torch.Generator().manual_seed(0))
        twin.load_state_dict(dg.state_dict_to_torch(ref.state_dict()))
        entries, held = tgpt.measure_saved(twin, torch.from_numpy(idx), torch.from_numpy(targets))
        with FlopCounterMode(display=False) as counter:
            twin(torch.from_numpy(idx), torch.from_numpy(targets))[1].backward()
        out[attention] = {
            "held_bytes": held,
            "core_saved": [[e.name, list(e.shape), e.nbytes] for e in entries
                           if e.module.startswith("transformer.h.0.attn.core")],
            "flops": {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}}
    return out


def bench(repeats: int) -> dict:
    results: dict = {"method": METHOD, "repeats": repeats, "batch": BATCH,
                     "configs": {k: dataclasses.asdict(v) for k, v in CONFIGS.items()},
                     "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                     "torch": torch.__version__, "numpy": np.__version__, "threads": {}}
    for threads in (1, 2):
        out = subprocess.run([sys.executable, __file__, "--threads", str(threads), "--repeats",
                              str(repeats)], capture_output=True, text=True, check=True)
        data = json.loads(out.stdout)
        per = {}
        for c in CONFIGS:
            ratios = [r[f"{c}/reference"] / r[f"{c}/torch"] for r in data["rounds"]]
            per[c] = {"ratio": summarize(ratios),
                      "reference_ms": summarize([1e3 * r[f"{c}/reference"]
                                                 for r in data["rounds"]]),
                      "torch_ms": summarize([1e3 * r[f"{c}/torch"] for r in data["rounds"]]),
                      "phases": {p: {"ratio": summarize([r[f"{c}/reference/{p}"]
                                                         / r[f"{c}/torch/{p}"]
                                                         for r in data["rounds"]]),
                                     "reference_ms": summarize([1e3 * r[f"{c}/reference/{p}"]
                                                                for r in data["rounds"]])}
                                 for p in PHASES}}
        results["threads"][str(threads)] = {"configs": per, "profile_4x": data["profile"]}
    results["held_bytes"] = held_bytes()
    results["sdpa"] = sdpa_differences()
    return results


def learn() -> dict:
    torch.set_num_threads(1)
    curves = [gl.learn(tree, gl.CONTROL_STEPS, every=25) for tree in ("reference", "torch")]
    return {"method": "one thread (torch and NumPy's BLAS), wall time of the whole run",
            "target_accuracy": gl.TARGET_ACCURACY, "control_steps": gl.CONTROL_STEPS,
            "batch": gl.BATCH, "lr": gl.LR, "prefix": gl.PREFIX,
            "config": dataclasses.asdict(gl.CONFIG), "torch": torch.__version__,
            "curves": [dataclasses.asdict(c) | {"steps_to_target": gl.steps_to(c)}
                       for c in curves]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--free", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.threads:
        print(json.dumps(worker(args.threads, args.repeats)))
        return
    if args.free:
        from parity.drivers.gpt_free import end_differences

        results = {"torch": torch.__version__.split("+")[0], "batch": 4,
                   "rows": end_differences(4)}
    else:
        results = learn() if args.learn else bench(args.repeats)
    text = json.dumps(results, indent=1)
    if args.write:
        out = FREE_JSON if args.free else LEARN_JSON if args.learn else BENCH_JSON
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
