"""A training script written the way nanoGPT's train.py is: configuration as globals that
every `--key=value` of sys.argv overrides (nanoGPT's configurator, which refuses any other
argument), training at import, a checkpoint at the end, `--init_from=resume` to go on from
it. It cannot be a factory; resume-check runs it as it is run:

    cd examples && python -m parity resume-check --script "python train_script.py
        --out_dir={dir} --max_iters={steps}" --resume-flag=--init_from=resume --steps 8 --at 4

A small MLP with dropout, AdamW, batches drawn at random positions of a fixed dataset from
torch's global generator (nanoGPT's get_batch). The checkpoint holds the model, the
optimizer, iter_num and the torch RNG state; --save_rng=False leaves the RNG out, as
nanoGPT's own checkpoint does, and the resume then draws other batches and dropout masks.
"""

import os
import sys
from ast import literal_eval

import torch
from torch import nn

# -----------------------------------------------------------------------------
out_dir = "out-script"
max_iters = 8
init_from = "scratch"  # or "resume": go on from out_dir/ckpt.pt
save_rng = True  # False: the checkpoint holds no RNG state (nanoGPT's)
batch_size = 8
learning_rate = 1e-2
# nanoGPT's configurator: every --key=value overrides a global above, of the same type
for arg in sys.argv[1:]:
    if not (arg.startswith("--") and "=" in arg) or arg[2:].split("=")[0] not in globals():
        raise SystemExit(f"unknown argument {arg}")
    key, val = arg[2:].split("=", 1)
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    if type(attempt) is not type(globals()[key]):
        raise SystemExit(f"{key}={val}: expected a {type(globals()[key]).__name__}")
    globals()[key] = attempt
# -----------------------------------------------------------------------------

torch.set_num_threads(1)  # ops this small wait for the slowest thread
torch.manual_seed(1337)
g = torch.Generator().manual_seed(0)
x_all, y_all = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
iter_num = 0
path = os.path.join(out_dir, "ckpt.pt")
if init_from == "resume":
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    if "rng" in checkpoint:
        torch.set_rng_state(checkpoint["rng"])


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(x_all), (batch_size,))  # from the global generator
    return x_all[ix], y_all[ix]


while iter_num < max_iters:
    x, y = get_batch()
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1

os.makedirs(out_dir, exist_ok=True)
checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
              "iter_num": iter_num}
if save_rng:
    checkpoint["rng"] = torch.get_rng_state()
torch.save(checkpoint, path)
print(f"iter {iter_num}: loss {loss.item():.4f}, saved {path}")
