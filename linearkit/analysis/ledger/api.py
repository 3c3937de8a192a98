"""``ledger()``: check the arguments, take the model's path (linearkit, torch, a weights file
or a preset), then total it up (``budget.finish``).
"""

from __future__ import annotations

import os

import numpy as np

from ...core.module import Module
from .budget import OPTIMIZER_STATES, finish
from .linearkit_model import linearkit_pass
from .presets import PRESETS, preset
from .report import Ledger
from .safetensors_file import read_safetensors

__all__ = ["ledger"]


def _as_shape(input_shape, batch) -> tuple | None:
    if input_shape is None:
        if batch is not None:
            raise ValueError("batch= needs an input_shape (the shape of one sample)")
        return None
    if isinstance(input_shape, int | np.integer):
        input_shape = (input_shape,)
    try:
        shape = tuple(int(d) for d in input_shape)
    except TypeError:
        raise TypeError(f"input_shape must be a tuple of ints, got {input_shape!r}") from None
    if any(d < 0 for d in shape) or any(not float(d).is_integer() for d in input_shape):
        raise ValueError(f"input_shape must hold non-negative ints, got {input_shape!r}")
    if batch is not None:
        shape = (int(batch),) + shape
    return shape


def _is_torch_module(model) -> bool:
    mod = type(model).__module__ or ""
    if not mod.startswith("torch") and not any(
            (c.__module__ or "").startswith("torch.nn") for c in type(model).__mro__):
        return False
    return hasattr(model, "named_modules") and hasattr(model, "register_forward_hook")


def ledger(model, input_shape=None, *, dtype=None, optimizer: str | None = "adam",
           batch: int | None = None, master_dtype="auto", rank_check: bool = True) -> Ledger:
    """Parameters, FLOPs, memory of one training step, and redundant structure, per module.

    Memory counts what linearkit stores, in the dtypes it stores it (``linearkit.precision``):
    weights and buffers in their storage dtype (2 bytes an element for float16/bfloat16); for a
    16-bit trainable parameter the optimizer's float32 master copy and float32 states; gradients
    as ``precision.grad_dtype`` stores them (float32 for 16-bit parameters by default, their own
    dtype under ``policy(grads="storage")``); saved activations in the dtype each layer keeps
    them: the compute dtype (float32 for 16-bit layers, whose outputs are float32 too), or the
    policy's ``activations`` dtype for what layers keep through ``precision.saved_activation``
    (a Linear's input, a norm's xhat); a float16 Linear that needs dx also keeps its weight's
    float32 copy. The policy is read when ``ledger()`` is called (as a layer reads it when its
    forward runs): call it inside the same ``precision.policy(...)`` block as the training step.
    A torch model is counted with PyTorch's semantics (gradients and activations in the
    parameters' dtype).

    Parameters
    ----------
    model : linearkit Module, torch ``nn.Module``, path to a ``.safetensors`` file, or a preset
        name (``PRESETS``). A file gives parameters and memory only (no graph, so no FLOPs).
    input_shape : tuple of ints, optional
        The input's shape, batch included: ``(64, 784)``. Shapes are propagated without running
        the model (a ShapeError names the layer an input does not fit). Without it only
        parameters and weight memory are reported.
    dtype : NumPy dtype, optional
        Count every floating parameter and buffer as if stored in this dtype (default: each in
        its own); a 16-bit one computes (and keeps activations) in float32, as ``model.to``
        would make it.
    optimizer : 'adam', 'adamw' (2 states per trainable parameter), 'sgd-momentum' (1),
        'sgd' (0), or None for inference (no grads, no states, no saved activations).
    batch : int, optional
        When given, ``input_shape`` is one sample's shape and ``batch`` is prepended.
    master_dtype : 'auto', dtype or None
        Mixed precision: the master copy of trainable weights (optimizer states in its dtype
        too). 'auto' = what linearkit's optimizers keep: a float32 master (and float32 states)
        for each 16-bit trainable parameter, none for float32/float64 or frozen ones. A dtype:
        a master of every trainable parameter in it. None: no master (states in the storage
        dtype).
    rank_check : bool
        Compute singular values of each weight (up to 2**20 elements) for the low-rank finding.

    Returns
    -------
    Ledger
        ``print()`` it for the table; ``.totals``, ``.memory``, ``.findings``, ``.rows``,
        ``.to_markdown()``, ``.to_dict()``.

    Examples
    --------
    >>> import linearkit as lk
    >>> L = lk.analysis.ledger(lk.Linear(512, 256), (64, 512))
    >>> L.totals["params"], L.memory["weights"], L.memory["training_state"]
    (131328, 525312, 2101248)
    """
    if optimizer is not None:
        optimizer = str(optimizer).lower()
        if optimizer not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATES)} or None "
                             f"(inference), got {optimizer!r}")
    shape = _as_shape(input_shape, batch)
    override = None if dtype is None else np.dtype(dtype)
    notes: list[str] = []
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        described = _model_in_file(path) if os.path.isfile(path) else None
        if described is not None:
            model, name = described, os.path.basename(path)  # the file describes itself
        elif os.path.isfile(path):
            return finish(*read_safetensors(path, override), "safetensors",
                          os.path.basename(path), None, optimizer, master_dtype, rank_check,
                          [("this weights file has no architecture (saved without "
                            "linearkit's 'linearkit.spec' metadata), so no graph: FLOPs and "
                            "activations are unavailable; "
                           "every floating tensor but BatchNorm running statistics is counted "
                           "as a trainable parameter.")])
        elif path not in PRESETS:
            raise FileNotFoundError(f"{path!r} is neither a file nor a preset name "
                                    f"({', '.join(PRESETS)})")
        else:
            model, name = preset(path), path
    else:
        name = type(model).__name__
    if isinstance(model, Module):
        acc, sizes = linearkit_pass(model, shape, override)
        source = "linearkit"
    elif _is_torch_module(model):
        from .torch_model import torch_pass

        acc, sizes = torch_pass(model, shape, override)
        source = "torch"
    else:
        raise TypeError(f"ledger() takes a linearkit Module, a torch nn.Module, a .safetensors "
                        f"path or a preset name, got {type(model).__name__}")
    if shape is None:
        notes.append("no input_shape: FLOPs and activations are unavailable.")
    return finish(acc, sizes, source, name, shape, optimizer, master_dtype, rank_check, notes)


def _model_in_file(path: str):
    """The model a file written by ``linearkit.save`` describes (weights loaded), else None."""
    from ...io.model_file import model_from_metadata
    from ...storage.safetensors_header import read_header

    return model_from_metadata(path, read_header(path)[1])
