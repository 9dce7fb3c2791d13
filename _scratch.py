import dataclasses, numpy as np, torch
from torchao.float8 import Float8LinearConfig
from torchao.float8.float8_linear import Float8Linear
from torch_impl import fp8_train as T
g = torch.Generator().manual_seed(0)
for recipe, prec in [("tensorwise","fp8-tensorwise"),("rowwise","fp8-rowwise")]:
  for emulate in (True, False):
    for (N,K,O) in [(64,32,96),(256,128,32),(48,64,16)]:
        lin = torch.nn.Linear(K, O)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(O,K,generator=g)*0.05)
            lin.bias.copy_(torch.randn(O,generator=g))
        cfg = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
        ao = Float8Linear.from_float(torch.nn.Linear(K,O), config=cfg)
        with torch.no_grad():
            ao.weight.copy_(lin.weight); ao.bias.copy_(lin.bias)
        ours = T.ScaledLinear(lin, prec)
        x = torch.randn(N, K, generator=g)*3; go = torch.randn(N, O, generator=g)*1e-3
        xa = x.clone().requires_grad_(); xo = x.clone().requires_grad_()
        try:
            ya = ao(xa); ya.backward(go)
        except Exception as e:
            print(recipe, emulate, "FAILS", type(e).__name__, str(e)[:200]); break
        yo = ours(xo); yo.backward(go)
        d = lambda a,b: (a-b).abs().max().item()
        print(recipe, emulate, (N,K,O), d(ya,yo), d(xa.grad,xo.grad), d(ao.weight.grad, ours.weight.grad), d(ao.bias.grad, ours.bias.grad), torch.equal(ya,yo), torch.equal(xa.grad,xo.grad), torch.equal(ao.weight.grad, ours.weight.grad))
