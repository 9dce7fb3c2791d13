"""The compact transformer's claims (the kinds and the registry: parity/tolerances.py):
those in float32 and float64 are in parity/claims/gpt_fp.py, with what their eps bounds
scale by; those under autocast in parity/claims/gpt_amp.py; CLAIMS joins them. Below them,
the topic's twin manifest."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin
from parity.claims.gpt_amp import CLAIMS as AUTOCAST_CLAIMS
from parity.claims.gpt_fp import FP_CLAIMS

CLAIMS: tuple[Claim, ...] = (*FP_CLAIMS, *AUTOCAST_CLAIMS)

_ATT = ("gpt.attention.forward", "gpt.attention.backward")
_LN = ("gpt.layer_norm.forward", "gpt.layer_norm.backward")
_LP = ("gpt.autocast_layers_bf16", "gpt.autocast_layers_fp16")
_CORE_LP = ("gpt.attention_core_autocast_bf16", "gpt.attention_core_autocast_fp16")
_RUN = ("gpt.logits", "gpt.grads")


def _op(name: str, alias: str, *claims: str) -> Twin:
    return Twin(name, reference=f"reference.layers:{name}", alias=alias, claims=claims)

_same = Twin.same


MANIFEST = Manifest(
    topic="gpt",
    modules=("reference.layers", "reference.attention", "torch_impl.attention",
             "reference.gpt", "torch_impl.gpt"),
    rows=(
        Twin("LN_EPS", reference="reference.layers:LN_EPS", claims=_LN,
             why="nn.LayerNorm's default eps: an argument in torch, no object"),
        _op("embedding", "torch.nn.functional.embedding", "gpt.embedding"),
        _op("embedding_backward", "torch.ops.aten.embedding_dense_backward", "gpt.embedding"),
        _op("layer_norm", "torch.nn.functional.layer_norm", *_LN),
        _op("layer_norm_backward", "torch.ops.aten.native_layer_norm_backward", *_LN,
            "gpt.layer_norm.bias_grad"),
        Twin("torch_cpu_row_sum", reference="reference.layers:torch_cpu_row_sum",
             claims=("gpt.layer_norm.bias_grad",),
             why="the summation order of torch's CPU LayerNorm backward, written out: C++ "
                 "inside native_layer_norm_backward"),
        _op("softmax", "torch.softmax", *_ATT),
        _op("softmax_backward", "torch.ops.aten._softmax_backward_data", *_ATT),
        _op("masked_fill", "torch.Tensor.masked_fill", *_ATT),
        _op("scale", "torch.mul", *_ATT),
        _op("bmm", "torch.bmm", *_ATT),
        _op("Embedding", "torch.nn.Embedding", "gpt.embedding"),
        _op("LayerNorm", "torch.nn.LayerNorm", *_LN),
        Twin("init_normal", reference="reference.attention:init_normal",
             claims=("gpt.init",),
             why="GPT-2's normal init from the reference's rng: the torch GPT draws its own "
                 "(held by gpt.init's statistics, not the draws)"),
        Twin("linear", reference="reference.attention:linear", alias="torch.nn.Linear",
             claims=("gpt.init", "gpt.init_constants")),
        _same("attention", "AttentionCore", *_ATT, *_CORE_LP, "gpt.sdpa"),
        _same("attention", "CausalSelfAttention", *_RUN, "gpt.sdpa_logits"),
        _same("gpt", "MLP", *_RUN, *_LP),
        _same("gpt", "Block", *_RUN, "gpt.autocast_free_residual"),
        Twin("torch_node_name", reference="reference.gpt:torch_node_name",
             claims=("gpt.saved_tensors",),
             why="names a reference save by torch's node and attribute, for the comparison"),
        Twin("NextTokenLoss", reference="reference.gpt:NextTokenLoss",
             torch="torch_impl.train_models:NextTokenLoss", claims=("gpt.loss",)),
        Twin("Transformer", reference="reference.gpt:Transformer", alias="torch.nn.ModuleDict",
             claims=("gpt.state_dict_roundtrip",)),
        Twin("empty_embedding", reference="reference.layers:Embedding",
             torch="torch_impl.gpt:empty_embedding", claims=("gpt.init",)),
        _same("gpt", "GPT", *_RUN, "gpt.loss", "gpt.boundary", "gpt.state_dict_roundtrip",
              "gpt.init", "gpt.init_constants", "gpt.sdpa_logits", "gpt.autocast_free",
              "gpt.autocast_free_residual", *_LP),
        Twin("measure_saved", reference="reference.gpt:GPT.tape",
             torch="torch_impl.gpt:measure_saved",
             claims=("gpt.saved_tensors", "gpt.autocast_saved_tensors")),
        Twin("matmuls", reference="reference.gpt:matmuls",
             alias="torch.utils.flop_counter.FlopCounterMode", claims=("gpt.flops",)),
        Twin("make_copy_task", reference="reference.data:make_copy_task",
             torch="torch_impl.data:make_copy_task", claims=("gpt.copy_task",)),
    ),
    headline="parity/test_gpt_bounds.py::"
             "test_one_block_forward_and_loss_match_torch_within_the_cross_entropy_budget",
)
