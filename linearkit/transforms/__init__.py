"""Model surgery: transforms of linear layers that prove their own equivalence.

Two tiers, as PyTorch's fusion utilities: pure functions on arrays (``merge_weights``,
``fold_batchnorm_weights``, ``factorize_weight``, ``quantize_weight``, ...) and module-level
transforms that copy the model, edit the copy, check it against the original on probe inputs and
return ``(new_model, report)`` — the input model is never modified. See docs/surgery.md.

============================  ==========================================================
``merge_linear(model)``       consecutive linear maps (nothing nonlinear between) -> one
``fold_norm(model)``          eval BatchNorm1d into the Linear before; LayerNorm's affine
                              into the Linear after; biases a norm cancels
``factorize(model, rank=)``   Linear -> Linear(in, r, bias=False), Linear(r, out) by SVD
``add_lora(model, rank=)``    frozen base + trainable low-rank lora_A, lora_B (peft's names)
``merge_lora`` / ``extract_lora``  adapter -> plain Linear, and a fine-tune -> adapter
``quantize(model, "int8")``   weight-only int8, per output channel
``fuse_qkv`` / ``split_qkv``  three projections <-> one Linear laid out [q | k | v]
``prune`` / ``to_sparse``     magnitude pruning, and CSR layers that store only the nonzeros
``compress(model, ...)``      the steps above in order; ``data=, max_drop=``: the smallest
                              model within an accuracy budget (see docs/compress.md)
============================  ==========================================================
"""

from __future__ import annotations

import importlib

from .transform_report import TransformReport

#: public name -> the submodule that defines it (loaded on first use). No submodule may share
#: a public function's name: importing ``transforms.quantize`` would bind the module over the
#: function on the package.
_WHERE = {
    "merge_weights": "merge", "merge_linear": "merge",
    "fold_batchnorm_weights": "fold", "fold_layernorm_weights": "fold", "fold_norm": "fold",
    "factorize_weight": "factorization", "factorize": "factorization",
    "rank_sweep": "factorize_sweep",
    "add_lora": "lora_transforms", "merge_lora": "lora_transforms",
    "extract_lora": "lora_transforms", "merge_lora_weights": "lora_transforms",
    "extract_lora_weights": "lora_transforms",
    "save_adapter": "lora_adapter", "load_adapter": "lora_adapter",
    "LoRAReport": "lora_transforms",
    "quantize_weight": "quantization", "quantize": "quantization",
    "fuse_qkv_weights": "qkv", "fuse_qkv": "qkv", "split_qkv": "qkv",
    "prune_weight": "pruning", "prune": "pruning", "to_sparse": "pruning",
    "compress": "pipeline",
    "CostlyTransformError": "budget", "BudgetReport": "budget", "plot_tradeoff": "budget",
}

__all__ = ["TransformReport"]
__all__ += list(_WHERE)


def __getattr__(name):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'linearkit.transforms' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{where}", __name__), name)


def __dir__():
    return sorted(__all__)
