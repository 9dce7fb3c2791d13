"""docs/resume.md: the inventory table (committed measurement), the directory policy, the
error family and the train command's flags (the code), the checkpoint I/O ratios
(committed benchmark)."""

from __future__ import annotations

import argparse
import inspect
import json

import ckpt
from ckpt import errors
from parity.lab.gendocs import DOCS, section

WHY = {
    "none": ("(nothing left out)", ""),
    "model": ("model", "the parameters"),
    "optimizer": ("optimizer", "momentum / `exp_avg` / `exp_avg_sq`, per-parameter step "
                  "counts, each group's current lr"),
    "scheduler": ("scheduler", "`last_epoch` and the recursively computed lr "
                  "(NOTE [ Chainable schedules ])"),
    "scaler": ("scaler", "loss scale S and growth tracker: which steps overflow and are skipped"),
    "rng": ("rng", "the generator dropout draws from (reference: the `numpy.random.Generator` "
            "shared with init; torch: an explicit `torch.Generator`, plus the CUDA one on CUDA)"),
    "data": ("data", "the sampler's (epoch, position): which batch comes next"),
    "step": ("step", "step counter (and skipped count): where the run ends"),
    "weights only": ('all but the model ("weights only", nanoGPT-style)', ""),
}


def _cell(value: float) -> str:
    return "**0**" if value == 0 else f"{value:.3g}"


@section("resume.md", "inventory")
def _() -> str:
    data = json.loads((DOCS / "data" / "resume_inventory.json").read_text(encoding="utf-8"))
    lines = [f"Case: {data['case']} (torch {data['torch']}, NumPy {data['numpy']}; "
             "`python -m parity.drivers.train` rewrites `docs/data/resume_inventory.json`).", "",
             "| item | why the next step needs it | left out: max \\|Δparam\\| reference | torch |",
             "|---|---|---|---|"]
    for key, (item, why) in WHY.items():
        ref, tor = (_cell(data[tree][key]) for tree in ("reference", "torch_impl"))
        lines.append(f"| {item} | {why} | {ref} | {tor} |")
    return "\n".join(lines)


@section("resume.md", "policy")
def _() -> str:
    lines = ["| the run finds | it does | held by (tests/test_resume_policy.py) |",
             "|---|---|---|"]
    lines += [f"| {finds} | {does} | `{test}` |" for finds, does, test in ckpt.POLICY]
    return "\n".join(lines)


@section("resume.md", "errors")
def _() -> str:
    lines = ["| error | raised when |", "|---|---|"]
    for name, cls in vars(errors).items():  # in the order the module defines them
        if inspect.isclass(cls) and issubclass(cls, ckpt.CheckpointError):
            doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
            lines.append(f"| `{name}` | {doc} |")
    return "\n".join(lines)


@section("resume.md", "train-flags")
def _() -> str:
    from parity.lab.cli import train

    parser = argparse.ArgumentParser(
        prog="python -m parity train", add_help=False,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=92,
                                                            max_help_position=30))
    train.add_arguments(parser)
    return "```text\n" + parser.format_help().strip() + "\n```"


@section("resume.md", "io")
def _() -> str:
    path = DOCS / "data" / "resume_io.json"
    if not path.exists():
        return "Not measured yet: run `python benchmarks/resume.py --write`."
    data = json.loads(path.read_text(encoding="utf-8"))
    lines = [f"{data['method']} Machine: {data['machine']}.", "",
             "| tree | size | save / (baseline save + fsync), wall | CPU | load+verify "
             "throughput / baseline load's, wall | CPU |", "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        cpu = row["median_cpu_ms"]
        lines.append(f"| {row['tree']} (vs {row['baseline']}) | {row['mib']} MiB | "
                     f"{row['save_ratio']:.2f}x [{row['save_ratio_lo']:.2f}, "
                     f"{row['save_ratio_hi']:.2f}] | {cpu['save'] / cpu['plain_save']:.2f}x | "
                     f"{row['load_ratio']:.2f}x [{row['load_ratio_lo']:.2f}, "
                     f"{row['load_ratio_hi']:.2f}] | {cpu['plain_load'] / cpu['load']:.2f}x |")
    lines += ["", f"Targets: save at most {data['targets']['save']}x, load+verify at least "
              f"{data['targets']['load']}x. {data['conditions']}"]
    return "\n".join(lines)


@section("resume.md", "io-ceiling")
def _() -> str:
    path = DOCS / "data" / "resume_io.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if "digests" not in data:
        return "Not measured yet: run `python benchmarks/resume.py --write`."
    digests = data["digests"]
    names = list(digests)
    lines = ["Each digest's throughput over 1 MiB pieces (sha256, blake2b, crc32: the "
             "standard library; xxh3_128: the `xxhash` package, the container's digest), "
             "median [min, max], GiB/s: " + "; ".join(
                 f"{name} {d['per_core_median']:.2f} [{d['per_core_lo']:.2f}, "
                 f"{d['per_core_hi']:.2f}] per core (CPU time), "
                 f"{d['two_threads_median']:.2f} with two threads (wall)"
                 for name, d in digests.items()) + f". {data['digests_conditions']}", "",
             "The best a verified load or a safe save can do with each digest, from the "
             "baselines' CPU time in the rows above (c: the plain side's CPU seconds, h: the "
             "digest's, size / per-core throughput). Verified load throughput / plain: "
             "c / (c + h) when no core is free, min(1, 2c / (c + h)) with two free cores "
             "(hashing and decoding split perfectly). Safe save / (plain save + fsync): at "
             "least (c + h) / c of CPU, and with two free cores at least max(1, (c + h) / 2w), "
             "w the plain save's wall time (its fsync included).", "",
             "| tree, size | load ceiling, no free core: " + " / ".join(names)
             + " | two free cores | save floor (CPU): " + " / ".join(names)
             + " | two free cores |", "|---|---|---|---|---|"]
    for row in data["rows"]:
        cpu, wall = row["median_cpu_ms"], row["median_ms"]
        h = {n: row["mib"] / 1024 / d["per_core_median"] * 1e3 for n, d in digests.items()}
        load_c, save_c = cpu["plain_load"], cpu["plain_save"]
        cells = [
            " / ".join(f"{load_c / (load_c + h[n]):.2f}" for n in names),
            " / ".join(f"{min(1.0, 2 * load_c / (load_c + h[n])):.2f}" for n in names),
            " / ".join(f"{(save_c + h[n]) / save_c:.2f}" for n in names),
            " / ".join(f"{max(1.0, (save_c + h[n]) / (2 * wall['plain_save'])):.2f}"
                       for n in names)]
        lines.append(f"| {row['tree']}, {row['mib']} MiB | " + " | ".join(cells) + " |")
    lines += ["", f"Targets: load at least {data['targets']['load']}x, save at most "
              f"{data['targets']['save']}x."]
    return "\n".join(lines)
