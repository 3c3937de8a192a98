"""PyTorch interop: ``from_torch(module)``, ``to_torch(model)`` and ``load_torch_state(path)``.

Converting foreign types happens here, at the edge, through the layer rules' torch twins
(``LayerRule.torch``, ``linearkit.rules.TorchTwin``; the shipped ones in
``linearkit/rules/torch_rules.py``): a torch layer type, the linearkit type it becomes, and its
constructor arguments (read the same way on both sides, since linearkit uses PyTorch's names).
A user's layer converts once its rule names a twin. Matching is by exact type on both sides, so
a user's subclass of ``nn.Linear`` with its own ``forward`` is refused rather than silently
converted as a plain Linear (and so is a subclass of ``lk.Linear`` without a rule of its own).

Decisions:

* ``nn.ModuleList`` / ``nn.ModuleDict`` become ``linearkit.ModuleList`` / ``ModuleDict`` and
  back, with the same child names (so the state-dict keys stay the same). Neither side can call
  one: the order a custom module uses its children in is that module's forward, so what
  converts is the children and their weights. A chain to run converts as ``nn.Sequential``.
* ``linearkit.Residual`` maps to ``TorchResidual`` (``linearkit.io.torch.TorchResidual``, built
  on first use): a two-line torch module computing ``x + module(x)`` whose child is named
  ``module``, as in linearkit, so the keys agree; ``from_torch`` converts it back.
* ``nn.LazyLinear`` converts once materialized (PyTorch then turns it into an ``nn.Linear``);
  an unmaterialized one, on either side, is refused: its weights do not exist yet.
* Dtypes are kept (float16, bfloat16, float32, float64; bfloat16 is ``ml_dtypes.bfloat16`` on
  the linearkit side, its 16 bits carried over unchanged); each module's training flag and each
  parameter's ``requires_grad`` are copied; a module shared under two names stays shared; every
  parameter and buffer is copied through ``load_state_dict`` with ``strict=True``, so the
  state-dict keys are identical. ``from_torch`` builds its layers without their random init and
  copies each torch tensor straight into the new array (read through a view of the tensor's
  memory), so a conversion costs the model's bytes once, and the library's random stream
  does not move.

torch is imported inside the functions; without it they raise ``ModuleNotFoundError`` naming
``pip install "linearkit[torch]"``.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import precision
from ..core.module import Module
from ..errors import AllocationError, FormatError
from ..layers.linear import uninitialized
from ..rules import registered_types, torch_twins

__all__ = ["array_to_tensor", "from_torch", "load_torch_state", "tensor_to_numpy", "to_torch"]


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


def __getattr__(name):
    # TorchResidual subclasses torch.nn.Module, so it exists only once torch is imported: the
    # path Residual's twin names ("linearkit.io.torch.TorchResidual") resolves here.
    if name == "TorchResidual":
        return _residual_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dtypes() -> dict:
    """``{torch dtype: NumPy dtype}`` of the floating dtypes both sides store (bfloat16 only
    where ml_dtypes, which gives NumPy that dtype, is installed)."""
    torch = _torch()
    names = {torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
             torch.float64: np.dtype(np.float64)}
    try:
        names[torch.bfloat16] = precision.bfloat16()
    except ImportError:
        pass
    return names


def tensor_to_numpy(t) -> np.ndarray:
    """A torch tensor's values as a new ndarray of the same dtype; bfloat16 (which NumPy's
    ``Tensor.numpy()`` refuses) goes through its 16 bits: int16 on the torch side, viewed as
    ``ml_dtypes.bfloat16`` — every value, NaN payloads and signed zeros included, unchanged."""
    return _tensor_view(t).copy()


def _tensor_view(t) -> np.ndarray:
    """``tensor_to_numpy(t)`` without the copy: an ndarray over the (CPU) tensor's memory, for
    a caller that copies it into arrays of its own at once."""
    torch = _torch()
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(precision.bfloat16())
    return t.numpy()


def array_to_tensor(a):
    """An ndarray as a torch tensor of the same dtype (bfloat16 by its 16 bits, as
    ``tensor_to_numpy``), owning its memory."""
    return _array_view(np.array(a))  # a copy: the tensor must not share the model's memory


def _array_view(a: np.ndarray):
    """``array_to_tensor(a)`` without the copy: a tensor over ``a``'s memory, for a caller
    that copies it into tensors of its own at once."""
    torch = _torch()
    a = np.asarray(a)
    if precision.is_16bit(a.dtype) and a.dtype != np.float16:  # ml_dtypes.bfloat16
        return torch.from_numpy(np.asarray(a, order="C").view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _dtype(tm, where: str, default, recurse: bool = False):
    """The NumPy dtype of a torch module's own tensors (``default`` when it has none)."""
    names = _dtypes()
    for t in list(tm.parameters(recurse=recurse)) + list(tm.buffers(recurse=recurse)):
        if t.is_floating_point():
            if t.dtype not in names:
                if recurse:  # the model's default: the module itself will be named
                    continue
                hint = ("bfloat16 needs the ml_dtypes package (pip install ml_dtypes), or "
                        "convert it first: module.float()" if t.dtype == _torch().bfloat16
                        else "convert it first: module.float()")
                raise FormatError(f"{where} holds {t.dtype} tensors; linearkit stores float16, "
                                  "bfloat16, float32 or float64", hint=hint)
            return names[t.dtype]
    return default


def _table(side: str) -> dict:
    """``{source type: (target type, twin)}`` converting from ``side`` ('torch' or
    'linearkit'), read off the registered rules' torch twins (``linearkit.rules.torch_twins``).

    From torch the keys are the twins' torch classes (those with ``from_torch``; where two
    rules name one class, the later registered wins); from linearkit they are the layer types
    whose own rule has a twin with ``to_torch``. A twin with ``build`` is a container, rebuilt
    from its children by ``_convert``.
    """
    table = {}
    for layer_type in registered_types():
        for twin in torch_twins(layer_type):
            if side == "torch" and twin.from_torch:
                table[twin.resolve()] = (layer_type, twin)
            elif side == "linearkit" and twin.to_torch:
                table[layer_type] = (twin.resolve(), twin)
    return table


def _children(module) -> list:
    """``[(name, child)]``: every direct child of ``module`` (torch's or linearkit's) under each
    of its names, in order — a child shared under two names appears under both (PyTorch's and
    linearkit's ``named_children()`` give it once), so the state-dict keys agree."""
    return [(name, child) for name, child in module.named_modules(remove_duplicate=False)
            if name and "." not in name]


def _where(path: str, side: str) -> str:
    return f"{side} module '{path}'" if path else f"the root {side} module"


def _convert(module, table: dict, side: str, dtype_of, memo: dict, path=""):
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
    target, twin = entry
    if twin.is_container:  # children first, same names
        children = OrderedDict(
            (name, _convert(child, table, side, dtype_of, memo,
                            f"{path}.{name}" if path else name))
            for name, child in _children(module))
        built = twin.build(target, children)
    else:
        kwargs = twin.arguments(module, dtype_of(module, where))
        try:
            built = target(**kwargs)
        except AllocationError as err:  # too large for this machine's memory: named by path
            raise err.at(path)
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
        ModuleDict, TorchResidual — nested freely.
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
    table = _table("torch")
    default = np.dtype(dtype) if dtype is not None else _dtype(
        module, "the torch model", np.dtype(np.float32), recurse=True)
    with uninitialized():  # every value is copied from the torch module next
        model = _convert(module, table, "torch", lambda m, where: _dtype(m, where, default), {})
    model.load_state_dict({k: _tensor_view(v) for k, v in module.state_dict().items()})
    _copy_requires_grad(module.named_parameters(), model.named_parameters())
    return model


def to_torch(model: Module):
    """The torch module computing what the linearkit ``model`` computes, with its weights.

    The inverse of ``from_torch``: same dtypes, training flags and state-dict keys;
    ``lk.Residual`` becomes ``TorchResidual``. An unsupported module raises
    ``linearkit.FormatError`` naming its path and type.
    """
    _torch()  # without torch: the ModuleNotFoundError naming the extra, before anything else
    if not isinstance(model, Module):
        raise TypeError(f"to_torch expects a linearkit Module, got {type(model).__name__}")
    table = _table("linearkit")
    dtypes = {numpy: t for t, numpy in _dtypes().items()}

    def dtype_of(m, where):
        dtype = np.dtype(getattr(m, "dtype", np.float32))
        if dtype not in dtypes:
            raise FormatError(f"{where} stores {dtype}, which has no torch dtype here; expected "
                              "float16, bfloat16, float32 or float64",
                              hint="convert it first: model.to(np.float32)")
        return dtypes[dtype]

    module = _convert(model, table, "linearkit", dtype_of, {})
    module.load_state_dict({k: _array_view(v) for k, v in model.state_dict().items()})
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
