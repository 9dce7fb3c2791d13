"""What torch.compile did with the MLP under this torch: the graph-break catalogue's counts
and reasons, the whole training step's capture, recompiles per dynamic-shape mode, and the
compiled numerics' worst case against each claim's bound.

    python benchmarks/compile.py [--no-write]
    /work/venvs/t2.6.0/bin/python benchmarks/compile.py      # another torch: its own record

Writes (merges) this torch version's record into docs/data/compile.json, keyed by version,
so docs/compile.md shows every version measured side by side (python -m parity docs). The
one timing, the cold compile of the small case (fresh TORCHINDUCTOR_CACHE_DIR, wall clock,
one run), is printed with the machine's load: it is an order of magnitude, not a benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from parity.compare import in_eps_units  # noqa: E402
from parity.drivers import compile as dc  # noqa: E402
from parity.drivers.compile_breaks import CATALOGUE  # noqa: E402
from torch_impl import compile as tc  # noqa: E402
from torch_impl.loss_scaling import make_scaler  # noqa: E402
from torch_impl.nn import make_mlp  # noqa: E402
from torch_impl.train import train_step  # noqa: E402

OUT = ROOT / "docs" / "data" / "compile.json"
CASES = (dc.SMALL, dc.Case(activation="tanh", batch=64, seed=1),
         dc.Case(sizes=(24, 64, 64, 64, 10), batch=48, seed=2),
         dc.Case(activation="relu", batch=16, seed=3))


def catalogue() -> list[dict]:
    model = make_mlp((16, 32, 8), "gelu", generator=torch.Generator().manual_seed(0))
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(1))
    rows = []
    with contextlib.redirect_stdout(io.StringIO()):
        for e in CATALOGUE:
            b, r = tc.explain(e.broken, model, x), tc.explain(e.repaired, model, x)
            rows.append({"name": e.name, "graphs": b.graph_count, "breaks": b.graph_break_count,
                         "reasons": [reason for reason, _ in b.break_reasons],
                         "repaired_graphs": r.graph_count, "repaired_breaks": r.graph_break_count})
    return rows


def step_capture() -> dict:
    """explain() of the whole train_step, fp32 with clipping (the compiled step's capture)."""
    g = torch.Generator().manual_seed(0)
    model = make_mlp((16, 32, 8), "gelu", generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(6, 16, generator=g), torch.randint(0, 8, (6,), generator=g)
    e = tc.explain(train_step, model, torch.nn.CrossEntropyLoss(), opt, make_scaler("fp32"),
                   x, y, precision="fp32", max_grad_norm=1.0)
    return {"graphs": e.graph_count, "breaks": e.graph_break_count,
            "reasons": [f"{reason} ({where})" for reason, where in e.break_reasons],
            "ops_per_graph": list(e.ops_per_graph)}


def numerics() -> tuple[list[dict], float]:
    rows, cold = [], 0.0
    for i, case in enumerate(CASES):
        torch._dynamo.reset()
        began = time.perf_counter()
        n = dc.numerics(case)
        if i == 0:
            cold = time.perf_counter() - began
        _, reference, x, y = dc.build(case)
        worst = [dc.bounds(reference, x, y, same_matmuls=same, logits_difference=np.abs(
            n.compiled["output"].astype(np.float64) - other["output"]))
            for same, other in ((True, n.eager), (False, n.reference))]
        for key in n.eager:
            a = n.compiled[key]
            rows.append({
                "case": f"{case.activation} {'-'.join(map(str, case.sizes))} N={case.batch}",
                "entry": key, "size": int(np.size(a)),
                "differ": int(np.sum(a != n.eager[key])),
                "eager": float(np.max(in_eps_units(a, n.eager[key], n.bound_eager[key]))),
                "reference": float(np.max(in_eps_units(a, n.reference[key],
                                                       n.bound_reference[key]))),
                # against the worst-case propagation (`bounds`), what the claims used before
                "eager_worst": float(np.max(in_eps_units(a, n.eager[key], worst[0][key]))),
                "reference_worst": float(np.max(in_eps_units(a, n.reference[key],
                                                             worst[1][key])))})
    return rows, cold


def gpt() -> dict:
    """The transformer (parity/drivers/compile_gpt.py): per entry, compiled vs eager and vs
    the reference against the probe bound, float32 and bfloat16 autocast; the recompiles."""
    from parity.drivers import compile_gpt as cg

    out: dict = {"case": str(cg.GPT_SMALL)}
    for precision in ("fp32", "bf16"):
        torch._dynamo.reset()
        began = time.perf_counter()
        n = cg.numerics(cg.GPT_SMALL, precision)
        seconds = time.perf_counter() - began
        eager = cg.ratios(n.compiled, n.eager, n.bound)
        ref = cg.ratios(n.compiled, n.reference, n.bound) if n.reference else {}
        out[precision] = {"seconds": round(seconds, 1), "compiled_backward": n.compiled_backward,
                          "rows": [{"entry": k, "size": int(np.size(n.eager[k])),
                                    "differ": int(np.sum(n.compiled[k] != n.eager[k])),
                                    "eager": eager[k], "reference": ref.get(k)}
                                   for k in n.eager]}
    return {**out, **gpt_recompiles()}


def gpt_recompiles() -> dict:
    """The transformer's recompiles per mode, and over a short sequence then a full block."""
    from parity.drivers import compile_gpt as cg

    def record(r: tc.Recompiles | str) -> dict | str:
        if isinstance(r, str):  # Dynamo refused: the exception's class
            return r
        return {"graphs": r.graphs,  # the checkout's path cut to the repository's
                "failed_guards": [re.sub(r"\S*/(torch_impl/\S+)", r"\1", g)
                                  for g in r.failed_guards]}

    return {"recompiles": {m: record(cg.count_shape_recompiles(m)) for m in cg.MODES},
            "full_block": {m: record(cg.count_full_block(m))
                           for m in ("dynamic", "mark_dynamic")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print, do not write")
    parser.add_argument("--only", choices=("all", "mlp", "gpt", "gpt-recompiles"),
                        default="all", help="measure the MLP's record, the transformer's, "
                        "only the transformer's recompiles, or both records (default)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    version = torch.__version__.split("+")[0]
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    record = dict(data.get(version, {}))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        if args.only in ("all", "mlp"):
            rows, cold = numerics()
            record.update({
                "machine": machine, "catalogue": catalogue(), "train_step": step_capture(),
                "recompiles": {m: {"graphs": r.graphs, "failed_guards": list(r.failed_guards)}
                               for m in dc.MODES for r in [dc.count_shape_recompiles(m)]},
                "numerics": rows, "cold_compile_s": round(cold, 1)})
        if args.only in ("all", "gpt"):
            record["gpt"] = {"machine": machine, **gpt()}
        if args.only == "gpt-recompiles":
            record["gpt"] = {**record.get("gpt", {}), **gpt_recompiles()}
    print(json.dumps(record, indent=1))
    if args.no_write:
        return
    data[version] = record
    OUT.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
    print(f"wrote {version} into {OUT}")


if __name__ == "__main__":
    main()
