"""The transformer's training step, reference vs torch, and the learning control.

    python benchmarks/gpt.py [--repeats 15] [--write]      step times, 1 and 2 threads
    python benchmarks/gpt.py --learn [--write]             the copy-task learning curves

Step: zero_grad, forward with targets, backward, AdamW step, float32, batch 32, on the tiny
default config (vocab 12, block 16, 2 layers, 2 heads, width 32) and on a 4x larger one
(width 64, 4 heads, 4x the parameters per block; 4 layers, block 32).

Method: each thread count runs in its own worker process, because NumPy's BLAS reads its
thread count (OPENBLAS_NUM_THREADS) once, when it loads; the worker also sets
torch.set_num_threads. Wall time (time.perf_counter: two threads must be seen to help) of
one step; one warm-up round, then `repeats` rounds, each running every (config, tree) once in
an order shuffled per round; the reference/torch ratio is taken within a round and
summarized by the median and min-max over rounds. Wall time on a shared machine is noisy:
compare the ratios, not the seconds. The worker also profiles the reference's step on the
larger config (cProfile, tottime per function) to say where it loses.

Held bytes: the tape's held bytes after a forward with targets and torch's hook
measurement (distinct storages) on each config: equal (claim gpt.saved_tensors).

--learn: both trees train the tiny config on the copy task for 400 steps on one thread
(parity/drivers/gpt_learn.py, CONTROL_STEPS), held-out copy accuracy every 25 steps.
--write saves docs/data/gpt_bench.json or docs/data/gpt_learning.json.
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
    ref, twin = dg.make_pair(config, np.float32, 0)
    idx, targets = dg.tokens(config, BATCH, config.block_size, 1)
    t_idx, t_tgt = torch.from_numpy(idx), torch.from_numpy(targets)
    ropt, topt = roptim.AdamW(ref.parameters(), lr=1e-3), torch.optim.AdamW(twin.parameters(),
                                                                            lr=1e-3)

    def ref_step() -> None:
        ref.zero_grad()
        ref.forward(idx, targets)
        ref.backward()
        ropt.step()

    def torch_step() -> None:
        topt.zero_grad()
        twin(t_idx, t_tgt)[1].backward()
        topt.step()

    return {"reference": ref_step, "torch": torch_step}


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
            start = time.perf_counter()
            steps[c][t]()
            times[f"{c}/{t}"] = time.perf_counter() - start
        if r:  # round 0 warms up
            rounds.append(times)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        steps["4x"]["reference"]()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    top = sorted(((v[2], f"{Path(k[0]).name}:{k[1]}({k[2]})") for k, v in stats.items()),
                 reverse=True)[:8]
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
                      "torch_ms": summarize([1e3 * r[f"{c}/torch"] for r in data["rounds"]])}
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
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.threads:
        print(json.dumps(worker(args.threads, args.repeats)))
        return
    results = learn() if args.learn else bench(args.repeats)
    text = json.dumps(results, indent=1)
    if args.write:
        (LEARN_JSON if args.learn else BENCH_JSON).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
