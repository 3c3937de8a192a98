"""PyTorch interop: ``from_torch(module)``, ``to_torch(model)`` and ``load_torch_state(path)``.

Converting foreign types happens here, at the edge, through one table (``_table``): a torch
layer type, the linearkit type it becomes, and its constructor arguments (read the same way on
both sides, since linearkit uses PyTorch's names).
Matching is by exact type, so a user's subclass of ``nn.Linear`` with its own ``forward`` is
refused rather than silently converted as a plain Linear.

Decisions:

* ``nn.ModuleList`` becomes a ``linearkit.Sequential`` with the same child names (so the state
  dict keys stay the same): a list of layers means "apply them in order", the way
  ``for layer in layers: x = layer(x)`` uses it. PyTorch cannot call a ModuleList itself, so
  ``to_torch`` gives back an ``nn.Sequential``.
* ``linearkit.Residual`` maps to ``TorchResidual`` (built on first use): a two-line torch
  module computing ``x + module(x)`` whose child is named ``module``, as in linearkit, so the
  keys agree; ``from_torch`` converts it back.
* ``nn.LazyLinear`` converts once materialized (PyTorch then turns it into an ``nn.Linear``);
  an unmaterialized one, on either side, is refused: its weights do not exist yet.
* Dtypes are kept (float16, float32, float64); each module's training flag and each
  parameter's ``requires_grad`` are copied; a module shared under two names stays shared; every
  parameter and buffer is copied through ``load_state_dict`` with ``strict=True``, so the
  state-dict keys are identical.

torch is imported inside the functions; without it they raise ``ModuleNotFoundError`` naming
``pip install "linearkit[torch]"``.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import layers as L
from ..errors import FormatError
from ..core.module import Module

__all__ = ["from_torch", "load_torch_state", "to_torch"]


def _torch():
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError('PyTorch interop needs torch: pip install "linearkit[torch]"'
                                  ) from None
    return torch


_RESIDUAL = None


def _residual_class():
    """``TorchResidual``: ``y = x + module(x)``, the torch twin of ``linearkit.Residual``."""
    global _RESIDUAL
    if _RESIDUAL is None:
        nn = _torch().nn

        class TorchResidual(nn.Module):
            """``y = x + module(x)`` (made by ``linearkit.io.to_torch`` for ``lk.Residual``)."""

            def __init__(self, module):
                super().__init__()
                self.module = module

            def forward(self, x):
                return x + self.module(x)

        _RESIDUAL = TorchResidual
    return _RESIDUAL


def _dtype(tm, where: str, default, recurse: bool = False):
    """The NumPy dtype of a torch module's own tensors (``default`` when it has none)."""
    torch = _torch()
    for t in list(tm.parameters(recurse=recurse)) + list(tm.buffers(recurse=recurse)):
        if t.is_floating_point():
            names = {torch.float16: np.float16, torch.float32: np.float32,
                     torch.float64: np.float64}
            if t.dtype not in names:
                if recurse:  # the model's default: the module itself will be named
                    continue
                raise FormatError(f"{where} holds {t.dtype} tensors; linearkit stores float16, "
                                  "float32 or float64", hint="convert it first: module.float()")
            return np.dtype(names[t.dtype])
    return default


def _table():
    """``[(torch type, linearkit type, arguments)]``, ``arguments(module, dtype) -> kwargs``.

    linearkit's layers use PyTorch's constructor and attribute names, so one function reads
    the arguments off a module of either side. Containers (``arguments`` None: Sequential,
    ModuleList, Residual) are rebuilt from their children by ``_convert``. ``dtype`` is the
    module's, in the target's terms.
    """
    nn = _torch().nn

    def none(m, dt):
        return {}

    def linear(m, dt):
        return {"in_features": m.in_features, "out_features": m.out_features,
                "bias": m.bias is not None, "dtype": dt}

    def layer_norm(m, dt):
        return {"normalized_shape": tuple(m.normalized_shape), "eps": m.eps,
                "elementwise_affine": m.elementwise_affine,
                "bias": m.bias is not None or not m.elementwise_affine, "dtype": dt}

    def batch_norm(m, dt):
        return {"num_features": m.num_features, "eps": m.eps, "momentum": m.momentum,
                "affine": m.affine, "track_running_stats": m.track_running_stats,
                "bias": m.bias is not None or not m.affine, "dtype": dt}

    return [
        (nn.Linear, L.Linear, linear),
        (nn.ReLU, L.ReLU, none), (nn.Tanh, L.Tanh, none), (nn.Sigmoid, L.Sigmoid, none),
        (nn.SiLU, L.SiLU, none), (nn.Identity, L.Identity, none),
        (nn.LeakyReLU, L.LeakyReLU, lambda m, dt: {"negative_slope": m.negative_slope}),
        (nn.GELU, L.GELU, lambda m, dt: {"approximate": m.approximate}),
        (nn.Softmax, L.Softmax, lambda m, dt: {"dim": m.dim}),
        (nn.LogSoftmax, L.LogSoftmax, lambda m, dt: {"dim": m.dim}),
        (nn.Dropout, L.Dropout, lambda m, dt: {"p": m.p}),
        (nn.Flatten, L.Flatten, lambda m, dt: {"start_dim": m.start_dim, "end_dim": m.end_dim}),
        (nn.LayerNorm, L.LayerNorm, layer_norm),
        (nn.BatchNorm1d, L.BatchNorm1d, batch_norm),
        (nn.Sequential, L.Sequential, None),
        (nn.ModuleList, L.Sequential, None),
        (_residual_class(), L.Residual, None),
    ]


def _where(path: str, side: str) -> str:
    return f"{side} module '{path}'" if path else f"the root {side} module"


def _convert(module, table: dict, make_container, side: str, dtype_of, memo: dict, path=""):
    """Rebuild ``module`` and its children through ``table`` (shared modules stay shared)."""
    if id(module) in memo:
        return memo[id(module)]
    where = f"{_where(path, side)} ({type(module).__name__})"
    if type(module).__name__ == "LazyLinear" and getattr(module, "in_features", 0) in (0, None):
        raise FormatError(f"{where} is an unmaterialized LazyLinear: its weight does not exist "
                          "yet", hint="run one forward pass (or load a state dict) first, so "
                                      "in_features is known")
    entry = table.get(type(module))
    if entry is None:
        supported = ", ".join(sorted({t.__name__ for t in table}))
        other = "linearkit" if side == "torch" else "torch"
        raise FormatError(f"{where} has no {other} equivalent; supported: {supported}",
                          hint="replace it, or convert the supported submodules one by one")
    target, kwargs_of = entry
    if kwargs_of is None:  # a container: children first, same names
        children = OrderedDict(
            (name, _convert(child, table, make_container, side, dtype_of, memo,
                            f"{path}.{name}" if path else name))
            # _modules, not named_children(): that yields a shared child once, under one name
            for name, child in module._modules.items() if child is not None)
        built = make_container(target, children)
    else:
        kwargs = kwargs_of(module, dtype_of(module, where))
        try:
            built = target(**kwargs)
        except (TypeError, ValueError) as err:
            raise FormatError(f"{where} cannot be converted: {err}") from None
    built.training = module.training  # each module's own flag (this does not recurse)
    memo[id(module)] = built
    return built


def from_torch(module, *, dtype=None) -> Module:
    """A linearkit model computing what the torch ``module`` computes, with its weights.

    Parameters
    ----------
    module : torch.nn.Module
        Built from the supported layers (see the module docstring): Linear (LazyLinear once
        materialized), ReLU, LeakyReLU, GELU, Tanh, Sigmoid, SiLU, Softmax, LogSoftmax,
        Dropout, LayerNorm, BatchNorm1d, Flatten, Identity, Sequential, ModuleList,
        TorchResidual — nested freely.
    dtype : numpy dtype, optional
        For modules that hold no tensors but have a dtype in linearkit (a LayerNorm without
        affine parameters, a BatchNorm1d with neither affine parameters nor running stats):
        default the dtype of the model's first floating tensor, else float32. Every other
        module keeps its own tensors' dtype.

    Returns
    -------
    Module
        New arrays (copies); same dtypes, training flags and state-dict keys. Anything else
        raises ``linearkit.FormatError`` naming the module's path, its type and the list.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    table = {t: (lk, args) for t, lk, args in _table()}

    def container(target, children):
        if target is L.Residual:
            return L.Residual(children["module"])
        return L.Sequential(children)

    default = np.dtype(dtype) if dtype is not None else _dtype(
        module, "the torch model", np.dtype(np.float32), recurse=True)
    model = _convert(module, table, container, "torch",
                     lambda m, where: _dtype(m, where, default), {})
    model.load_state_dict({k: v.detach().cpu().numpy() for k, v in module.state_dict().items()})
    _copy_requires_grad(module.named_parameters(), model.named_parameters())
    return model


def to_torch(model: Module):
    """The torch module computing what the linearkit ``model`` computes, with its weights.

    The inverse of ``from_torch``: same dtypes, training flags and state-dict keys;
    ``lk.Residual`` becomes ``TorchResidual``. An unsupported module raises
    ``linearkit.FormatError`` naming its path and type.
    """
    torch = _torch()
    if not isinstance(model, Module):
        raise TypeError(f"to_torch expects a linearkit Module, got {type(model).__name__}")
    table = {lk: (t, args) for t, lk, args in _table() if t is not torch.nn.ModuleList}
    table[L.LazyLinear] = table[L.Linear]
    dtypes = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
              np.dtype(np.float64): torch.float64}

    def dtype_of(m, where):
        return dtypes[np.dtype(getattr(m, "dtype", np.float32))]

    def container(target, children):
        if target is _residual_class():
            return target(children["module"])
        return torch.nn.Sequential(children)

    module = _convert(model, table, container, "linearkit", dtype_of, {})
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in
                            model.state_dict().items()})
    _copy_requires_grad(model.named_parameters(), module.named_parameters())
    return module


def _copy_requires_grad(source, target) -> None:
    """Frozen parameters stay frozen (the names agree: the state-dict keys were checked)."""
    flags = {name: p.requires_grad for name, p in source}
    for name, p in target:
        p.requires_grad = flags[name]  # a plain attribute on both sides (torch: a leaf)


def load_torch_state(path) -> dict[str, np.ndarray]:
    """Read a ``.pt``/``.pth`` state dict as ``{key: ndarray}`` — never by unpickling freely.

    Only ``torch.load(path, weights_only=True, map_location="cpu")`` reads the file: PyTorch's
    restricted unpickler, which refuses any object but tensors and plain containers, so a
    hostile file runs no code. bfloat16 tensors come back as float32 (exact). A file that
    ``weights_only`` refuses, that is not a flat ``{str: tensor}`` dict, or that is missing
    raises ``linearkit.FormatError`` naming the file.
    """
    torch = _torch()
    path = Path(path)
    if not path.is_file():
        raise FormatError("no such file", path=path)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - torch.load raises many types; all mean "refused"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FormatError(f"torch.load(weights_only=True) refused the file ({first})", path=path,
                          hint="only tensors and plain containers load; a file needing full "
                               "unpickling can run code. Re-save it from a trusted session "
                               "with torch.save(model.state_dict(), path)") from None
    if not isinstance(state, dict):
        raise FormatError(f"expected a state dict ({{name: tensor}}), got {type(state).__name__}",
                          path=path)
    arrays = {}
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            hint = ("a training checkpoint? pass its model entry: torch.save(ckpt['model'], ...)"
                    if isinstance(value, dict) else None)
            raise FormatError(f"entry {key!r} is a {type(value).__name__}, not a tensor; expected "
                              "a flat state dict {name: tensor}", path=path, hint=hint)
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.float()
        arrays[key] = value.numpy().copy()
    return arrays
