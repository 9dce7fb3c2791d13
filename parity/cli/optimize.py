"""One optimization through the gauntlet against the eager float32 baseline: equivalence
(its claims), timing with spread and a bootstrap interval, learning controls, resume.

    python -m parity optimize --what {autocast-bf16,autocast-fp16,recompute:SPEC,
        loader-workers:N} [--model mlp] [--repeats R] [--steps K] [--out DIR]

Writes DIR/optimize-<what>.md (the report), .json (every number) and .png (the timing
distributions, when matplotlib is installed). The verdict line is last:
`optimize: <what> PASS|FAIL, speedup X [lo, hi] (null|faster|slower)`.
A null result (the interval contains 1) is reported as null with the mechanism's expectation
beside it, never as a gain. Timing: CPU time of this process per step (wall time for
loader-workers, whose work moves to other processes), torch on one thread, R repeats of K
steps per side interleaved ABBA after a warm-up block. Method and thresholds:
parity/drivers/optimize.py and docs/optimize.md.
Exit status: 0 every check passed (whatever the speedup); 1 a check failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from parity.cli import EXIT_FAILED, EXIT_OK, UsageError, int_at_least, output_folder

HELP = "an optimization vs eager fp32: equivalence, timing spread, learning, resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", required=True, metavar="WHAT",
                   help="autocast-bf16 | autocast-fp16 | recompute:SPEC | loader-workers:N")
    p.add_argument("--model", choices=("mlp",), default="mlp",
                   help="the model optimized (the compact MLP)")
    p.add_argument("--repeats", type=int_at_least(3), default=15, metavar="R",
                   help="timed repeats per side (default 15)")
    p.add_argument("--steps", type=int_at_least(1), default=10, metavar="K",
                   help="training steps per timed repeat (default 10)")
    p.add_argument("--out", default="optimize-report", metavar="DIR",
                   help="where the report goes (default optimize-report/)")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from parity.drivers import optimize as drv

    try:
        opt = drv.parse(args.what)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = output_folder(args.out)
    stages = tqdm(total=len(opt.claims) + 4, desc=f"optimize {opt.what}", unit="stage",
                  leave=False)

    def progress(text: str) -> None:
        stages.set_postfix_str(text)
        stages.update(1)

    try:
        g = drv.run_gauntlet(opt, args.repeats, args.steps, progress)
    finally:
        stages.close()
    stem = "optimize-" + opt.what.replace(":", "-")
    (out / f"{stem}.json").write_text(json.dumps(as_json(g), indent=1) + "\n")
    picture = draw(g, out / f"{stem}.png")
    (out / f"{stem}.md").write_text(markdown(g, picture))
    print(markdown(g, picture), end="")
    print(f"report: {out / (stem + '.md')}")
    print(f"optimize: {opt.what} {'PASS' if g.passed else 'FAIL'}, speedup {verdict(g)}")
    return EXIT_OK if g.passed else EXIT_FAILED


def verdict(g: object) -> str:
    ratio, low, high = g.speedup  # type: ignore[attr-defined]
    word = "null" if g.null else ("faster" if low > 1 else "slower")  # type: ignore[attr-defined]
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}] ({word})"


def as_json(g: object) -> dict:
    from dataclasses import asdict

    from parity.drivers.optimize import ACCURACY, BASELINE, LEARN_STEPS, LOSS_BAND

    d = asdict(g)  # type: ignore[call-overload]
    d["passed"], d["null"] = g.passed, g.null  # type: ignore[attr-defined]
    d["baseline_config"] = {k: list(v) if isinstance(v, tuple) else v
                            for k, v in BASELINE.items()}
    d["controls"] = {"learn_steps": LEARN_STEPS, "loss_band": LOSS_BAND, "accuracy": ACCURACY}
    return d


def markdown(g: object, picture: Path | None) -> str:
    from parity.drivers.optimize import ACCURACY, BASELINE, LEARN_STEPS, LOSS_BAND, spread

    opt, t = g.opt, g.timing  # type: ignore[attr-defined]
    base, optimized = t.samples(opt.timer)
    clock = "CPU time of this process" if opt.timer == "cpu" else "wall time"
    lines = [f"# optimize: {opt.what}", "",
             f"Baseline: the torch MLP {BASELINE['sizes']}, batch {BASELINE['batch_size']}, "
             f"float32, eager, no recomputation, one thread. Verdict: "
             f"**{'PASS' if g.passed else 'FAIL'}**; speedup {verdict(g)}.", "",
             "## Equivalence", "", "| claim | bound | observed | holds |", "|---|---|---|---|"]
    lines += [f"| {cid} | {bound} | {observed:.4g} | {'yes' if ok else 'NO'} |"
              for cid, observed, bound, ok in g.claims]  # type: ignore[attr-defined]
    d = g.distance  # type: ignore[attr-defined]
    lines += ["", f"Distance from the float32 step on one batch (informative, the claims above "
              f"bound it): loss {d['loss']:.3g}, gradients {d['gradients']:.3g} "
              "(max |difference| / max |float32 value|).", "",
              "## Timing", "",
              f"Seconds per step, {clock}, {len(base)} repeats of {t.steps} steps per side, "
              "interleaved ABBA after a warm-up block; speedup = median baseline / median "
              "optimized, 95% bootstrap interval.", "",
              "| | median | IQR |", "|---|---|---|"]
    for name, x in (("baseline", base), ("optimized", optimized)):
        m, q25, q75 = spread(x)
        lines.append(f"| {name} | {m * 1e3:.3f} ms | {q25 * 1e3:.3f}-{q75 * 1e3:.3f} ms |")
    lines += ["", f"Speedup {verdict(g)}. What the mechanism predicts here: "
              f"{opt.expectation}."]
    if picture is not None:
        lines += ["", f"![timing distributions]({picture.name})"]
    lines += ["", "## Learning controls", "",
              f"{LEARN_STEPS} steps from the same seed; band: mean loss of the last 10 steps "
              f"<= {LOSS_BAND} x the first step's loss; accuracy over the whole task >= "
              f"{ACCURACY}.", "", "| run | first loss | last-10 loss | in band | accuracy | "
              "passes |", "|---|---|---|---|---|---|"]
    for name, r in g.learning.items():  # type: ignore[attr-defined]
        lines.append(f"| {name} | {r.initial_loss:.4f} | {r.final_loss:.4f} | "
                     f"{'yes' if r.in_band else 'NO'} | {r.accuracy:.4f} | "
                     f"{'yes' if r.accurate else 'NO'} |")
    mismatches, n, same = g.resume  # type: ignore[attr-defined]
    from parity.drivers.optimize import RESUME_AT, RESUME_TOTAL

    lines += ["", "## Resume", "",
              f"The optimized run interrupted at step {RESUME_AT} (checkpoint file written, "
              f"every object dropped, resumed from the file) to step {RESUME_TOTAL}, against "
              f"its uninterrupted twin: {mismatches:g} mismatching of {n} state values; state "
              f"digests {'equal' if same else 'DIFFER'}.", "",
              f"Gauntlet time: {g.seconds:.1f} s.", ""]  # type: ignore[attr-defined]
    return "\n".join(lines)


def draw(g: object, path: Path) -> Path | None:
    """The two timing distributions (every repeat a dot, the median a bar), or None without
    matplotlib."""
    from parity.pictures import have_matplotlib

    if not have_matplotlib():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    opt, t = g.opt, g.timing  # type: ignore[attr-defined]
    base, optimized = t.samples(opt.timer)
    fig, ax = plt.subplots(figsize=(5, 3))
    for i, x in enumerate((base, optimized)):
        ax.plot([i] * len(x), x * 1e3, "o", alpha=0.5)
        ax.hlines(float(np.median(x)) * 1e3, i - 0.2, i + 0.2, color="black")
    ax.set_xticks([0, 1], ["baseline fp32", opt.what])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel("ms per step (" + ("CPU" if opt.timer == "cpu" else "wall") + ")")
    ax.set_title(f"speedup {verdict(g)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
