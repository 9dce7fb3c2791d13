"""nanoGPT's train.py (karpathy/nanoGPT), cut down to run in seconds on a CPU, its loop and
checkpoint kept as they are: configuration globals that `--key=value` overrides (its
configurator), `config` = every one of them, lr = get_lr(iter_num) (no scheduler object),
batches at torch.randint offsets from the global generator (get_batch), the next batch
prefetched during each micro-step, `GradScaler(enabled=(dtype == 'float16'))` (which
disables itself without CUDA), an eval and a checkpoint every eval_interval iterations
holding exactly model, optimizer, model_args, iter_num, best_val_loss and config, and
`--init_from=resume` going on from it. Only the data (a short text here) and the model's
size differ.

    cd examples && python nanogpt_train.py --out_dir=out-nanogpt --max_iters=4
    cd examples && python nanogpt_train.py --out_dir=out-nanogpt --max_iters=8 --init_from=resume

save_rng adds the torch CPU generator's state ("rng_state") to the checkpoint:
  "no"            nanoGPT's own checkpoint: the resume draws other batches and dropout masks
  "at_save"       torch.get_rng_state() on the line that writes the checkpoint: still not
                  the straight run's draws, since the batch the next step trains on was
                  prefetched before the eval, and the resume draws it again from this state
  "before_batch"  the state from just before that prefetch (X, Y = get_batch('train')):
                  the resume draws the same batch, its eval the same batches, and the same
                  dropout masks follow; tests/test_audit_nanogpt_resume.py measures all three
"""

import math
import os
import sys
from ast import literal_eval
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
out_dir = "out-nanogpt"
eval_interval = 4
eval_iters = 2
always_save_checkpoint = True
init_from = "scratch"  # or "resume"
gradient_accumulation_steps = 2
batch_size = 4
block_size = 16
n_layer = 1
n_head = 2
n_embd = 32
dropout = 0.1
bias = False
learning_rate = 3e-2  # max learning rate
max_iters = 8
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 8
min_lr = 3e-3
device = "cpu"
dtype = "float16"  # 'float32', 'bfloat16' or 'float16' (the latter: a GradScaler)
save_rng = "no"  # "no" (nanoGPT's), "at_save" or "before_batch": the module docstring
config_keys = [k for k, v in globals().items()
               if not k.startswith("_") and isinstance(v, int | float | bool | str)]
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
if save_rng not in ("no", "at_save", "before_batch"):
    raise SystemExit(f"save_rng={save_rng}: expected no, at_save or before_batch")
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

torch.set_num_threads(1)  # ops this small wait for the slowest thread
torch.manual_seed(1337)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, ptdtype)

text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. " * 30
chars = sorted(set(text))
tokens = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
n = int(0.9 * len(tokens))
train_data, val_data = tokens[:n], tokens[n:]


def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))  # the global generator
    x = torch.stack([data[i:i + block_size] for i in ix])  # (B, T)
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])  # (B, T)
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self, a: dict) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(a["n_embd"], bias=a["bias"])
        self.attn = nn.MultiheadAttention(a["n_embd"], a["n_head"], dropout=a["dropout"],
                                          bias=a["bias"], batch_first=True)
        self.ln_2 = nn.LayerNorm(a["n_embd"], bias=a["bias"])
        self.mlp = nn.Sequential(nn.Linear(a["n_embd"], 4 * a["n_embd"], bias=a["bias"]),
                                 nn.GELU(), nn.Linear(4 * a["n_embd"], a["n_embd"],
                                                      bias=a["bias"]),
                                 nn.Dropout(a["dropout"]))
        mask = torch.triu(torch.ones(a["block_size"], a["block_size"], dtype=torch.bool), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)  # x: (batch, time, channels)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a: dict) -> None:
        super().__init__()
        self.wte = nn.Embedding(a["vocab_size"], a["n_embd"])
        self.wpe = nn.Embedding(a["block_size"], a["n_embd"])
        self.drop = nn.Dropout(a["dropout"])
        self.h = nn.ModuleList([Block(a) for _ in range(a["n_layer"])])
        self.ln_f = nn.LayerNorm(a["n_embd"], bias=a["bias"])
        self.lm_head = nn.Linear(a["n_embd"], a["vocab_size"], bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = idx.size()
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return logits, F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    def configure_optimizers(self) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2],
                   "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(beta1, beta2))


iter_num = 0
best_val_loss = 1e9
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                  bias=bias, vocab_size=None, dropout=dropout)
if init_from == "scratch":
    model_args["vocab_size"] = len(chars)
    model = GPT(model_args)
elif init_from == "resume":
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location=device,
                            weights_only=True)
    for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"]:
        model_args[k] = checkpoint["model_args"][k]
    model = GPT(model_args)
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
else:
    raise SystemExit(f"init_from={init_from}: expected scratch or resume")
model.to(device)

# nanoGPT's torch.cuda.amp.GradScaler(enabled=(dtype == 'float16')), by torch's current name:
# without CUDA it warns and disables itself, so on a CPU every dtype trains in float32
scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
optimizer = model.configure_optimizers()
if init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
    if "rng_state" in checkpoint:
        torch.set_rng_state(checkpoint["rng_state"])
checkpoint = None


@torch.no_grad()
def estimate_loss() -> dict[str, torch.Tensor]:
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it: int) -> float:
    if it < warmup_iters:  # linear warmup
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # cosine, 1 -> 0
    return min_lr + coeff * (learning_rate - min_lr)


rng_before_batch = torch.get_rng_state()
X, Y = get_batch("train")  # fetch the very first batch
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss "
              f"{losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {"model": model.state_dict(),
                              "optimizer": optimizer.state_dict(),
                              "model_args": model_args, "iter_num": iter_num,
                              "best_val_loss": best_val_loss, "config": config}
                if save_rng == "at_save":
                    checkpoint["rng_state"] = torch.get_rng_state()
                elif save_rng == "before_batch":
                    checkpoint["rng_state"] = rng_before_batch
                print(f"saving checkpoint to {out_dir}")
                os.makedirs(out_dir, exist_ok=True)
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    for _ in range(gradient_accumulation_steps):  # micro-steps
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        rng_before_batch = torch.get_rng_state()
        X, Y = get_batch("train")  # prefetch the next batch
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}")
    iter_num += 1
    if iter_num > max_iters:
        break
