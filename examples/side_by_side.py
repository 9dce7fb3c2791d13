"""Train the compact model in both implementations, side by side, and print both loss curves."""

import numpy as np
import torch

import reference.data as rdata
import reference.losses as rloss
import reference.nn as rnn
import reference.optim as roptim
import torch_impl.data as tdata
import torch_impl.nn as tnn
import torch_impl.state_mapping as tstate

# One model, one dataset, one data order: reference weights copied into torch, bit for bit.
ref_model = rnn.make_mlp([8, 32, 32, 3], activation="gelu", rng=np.random.default_rng(0))
torch_model = tnn.make_mlp([8, 32, 32, 3], activation="gelu", generator=torch.Generator())
torch_model.load_state_dict(tstate.state_dict_to_torch(ref_model.state_dict()))

ref_task, torch_task = rdata.make_task(0, 1024), tdata.make_task(0, 1024)
ref_loader = rdata.make_loader(ref_task, rdata.ResumableSampler(1024, seed=0), 64)
torch_loader = tdata.make_loader(torch_task, tdata.ResumableSampler(1024, seed=0), 64,
                                 generator=torch.Generator().manual_seed(0))

ref_opt = roptim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
torch_opt = torch.optim.SGD(torch_model.parameters(), lr=0.1, momentum=0.9)
ref_loss_fn, torch_loss_fn = rloss.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()

print("epoch  reference loss  torch loss")
for epoch in range(5):
    ref_losses, torch_losses = [], []
    for (x, y, _), (xt, yt, _) in zip(ref_loader, torch_loader, strict=True):
        ref_opt.zero_grad()
        loss = ref_loss_fn.forward(ref_model.forward(x), y)  # forward records the tape
        ref_model.backward(ref_loss_fn.backward())  # backward consumes it
        ref_opt.step()
        ref_losses.append(float(loss))

        torch_opt.zero_grad()
        loss_t = torch_loss_fn(torch_model(xt), yt)
        loss_t.backward()
        torch_opt.step()
        torch_losses.append(loss_t.item())
    print(f"{epoch:>5}  {np.mean(ref_losses):>14.6f}  {np.mean(torch_losses):>10.6f}")
