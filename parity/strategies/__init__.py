"""Named hypothesis strategies for edge domains, shared by the tests and `python -m parity fuzz`.

A test that targets an edge also shows the edge was reached (hypothesis.event / target,
or an explicit guard). One module per topic; this package re-exports
every public name, so `from parity.strategies import ties` works for any topic.
"""

from __future__ import annotations

from parity.strategies.budget import examples  # noqa: F401
from parity.strategies.data import (  # noqa: F401
    DATA_INTERRUPTIONS,
    data_batches_per_epoch,
    data_sampler_runs,
)
from parity.strategies.ddp import RANK_DTYPES, rank_values  # noqa: F401
from parity.strategies.formats import (  # noqa: F401
    EDGE_NAMES,
    double_rounding_cases,
    edge_float32,
    float32_arrays,
    float32_batch,
    float32_batches,
    float32_bits,
    float64_arrays,
    float64_batch,
    float64_batches,
    member_value,
    members,
    nan_payloads,
    near_ties,
    overflow_edge,
    specials,
    subnormal_edge,
    ties,
)
from parity.strategies.fp8_blockwise import (  # noqa: F401
    blockwise_edge_matrix,
    blockwise_edge_tiles,
    blockwise_tensors,
)
from parity.strategies.fp8_gemm import FORMAT_PAIRS, GEMM_EDGES, fp8_gemm_cases  # noqa: F401
from parity.strategies.fp8_scaling import (  # noqa: F401
    FP8_AMAX_EDGES,
    fp8_amaxes,
    fp8_histories,
    fp8_tensors,
)
from parity.strategies.gpt import gpt_batches, gpt_configs  # noqa: F401
from parity.strategies.loss_scaling import (  # noqa: F401
    scaler_factors,
    scaler_grad_stream,
    scaler_hyper,
    scaler_scales,
)
from parity.strategies.mx import EDGE_KINDS, edge_array, edge_block, mx_blocks  # noqa: F401
from parity.strategies.nn import (  # noqa: F401
    NN_DTYPES,
    mlp_sizes,
    nn_arrays,
    nn_shapes,
)
from parity.strategies.nvfp4 import (  # noqa: F401
    NVFP4_EDGE_SHAPE,
    nvfp4_cases,
    nvfp4_edge_tensors,
)
from parity.strategies.optim import (  # noqa: F401
    OPTIM_TAIL_SIZES,
    SR_EDGES,
    optim_adam_hyper,
    optim_grad_scales,
    optim_lrs,
    optim_sgd_hyper,
    optim_shapes,
    sr_bf16_inputs,
    sr_edge_bits,
)
from parity.strategies.recompute import (  # noqa: F401
    RECOMPUTE_KINDS,
    recompute_models,
    recompute_specs,
)
from parity.strategies.train import (  # noqa: F401
    GPT_TRAIN_RECOMPUTE,
    TRAIN_PRECISIONS,
    TRAIN_RECOMPUTE,
    gpt_train_configs,
    train_configs,
)
