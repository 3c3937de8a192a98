"""Module: the tree, parameters, state_dict, train/eval, repr, call hooks and the vjp entry.

The backward protocol (docs/architecture.md, docs/custom_modules.md): ``y = module(x)`` is a
forward that keeps nothing;
``y, backward = module.vjp(x, input_grad=True)`` returns a closure that adds each trainable
parameter's gradient into ``param.grad`` and returns ``dL/dx`` (None when ``input_grad=False``).
Every ``vjp`` a subclass defines is wrapped once (``vjp_protocol.guarded_vjp``): one call per
closure, ``dy`` checked and cast, errors located, hooks run, anomalies caught. ``Parameter``
lives in ``parameter.py``.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator

import numpy as np

from .. import precision as _precision
from ..errors import AllocationError, Located
from . import anomaly as _anomaly
from . import closures as _closures
from . import hooks as _hooks
from . import structure as _structure
from .parameter import Parameter
from .vjp_protocol import check_finite, guarded_vjp

__all__ = ["IncompatibleKeys", "Module", "Parameter"]


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
_ABSENT = object()   # an attribute not set yet


def _addindent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


def _loadable(raw, key: str, shape: tuple, dtype: np.dtype, errors: list[str]):
    """``raw`` as an array that can be assigned into ``shape``/``dtype``; None (and an entry in
    ``errors``) when it cannot."""
    try:
        value = np.asarray(raw)
    except Exception as err:  # a torch tensor that requires grad, a bfloat16 tensor, ...
        errors.append(f'While copying the parameter named "{key}", expected an array from '
                      f"checkpoint but {type(raw).__name__} could not be read as one: {err}")
        return None
    if value.dtype.kind == "V" and _precision.is_float(value.dtype):
        # bfloat16 (kind 'V'): checked as the float32 it converts to exactly; assigned as is.
        # Into a float array only its shape can be wrong: no float32 copy is made for that.
        if _precision.is_float(dtype):
            return _fitted(value, key, shape, errors)
        checked = _loadable(value.astype(np.float32), key, shape, dtype, errors)
        return None if checked is None else value.reshape(checked.shape)
    if value.dtype.kind not in "biuf" or (value.dtype.kind == "f" and dtype.kind in "iu"
                                          and not np.isfinite(value).all()):
        what = {"c": "complex values would lose their imaginary part",
                "f": "non-finite values cannot become integers"}.get(
                    value.dtype.kind, f"dtype {value.dtype} is not numeric")
        errors.append(f'While copying the parameter named "{key}", whose dtype in the model is '
                      f"{dtype}, the checkpoint's value cannot be cast: {what}.")
        return None
    if dtype.kind in "iu" and value.size and not _whole_in_range(value, dtype):
        info = np.iinfo(dtype)
        errors.append(f'While copying the parameter named "{key}", whose dtype in the model is '
                      f"{dtype}, the checkpoint's {value.dtype} value cannot be cast without "
                      f"changing it: only whole numbers in [{info.min}, {info.max}] load into "
                      f"{dtype} (float weights loaded into a quantized model? quantize the float "
                      "model instead).")
        return None
    return _fitted(value, key, shape, errors)


def _fitted(value: np.ndarray, key: str, shape: tuple, errors: list[str]):
    """``value`` when its shape is ``shape`` (a ``(1,)`` reshaped for a 0-d target), else None
    and the size mismatch in ``errors``."""
    if value.shape != shape:
        if shape == () and value.shape == (1,):
            return value.reshape(())  # PyTorch loads old checkpoints' (1,) into a 0-d buffer
        errors.append(f"size mismatch for {key}: copying a param with shape {value.shape} from "
                      f"checkpoint, the shape in current model is {shape}.")
        return None
    return value


def _whole_in_range(value: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every element of ``value`` is a whole number that ``dtype`` (an integer dtype)
    holds, so casting it changes nothing (a float 0.3 would silently become 0, a 300 wrap)."""
    if value.dtype.kind == "f" and not (value == np.trunc(value)).all():
        return False
    info = np.iinfo(dtype)
    return bool(value.min() >= info.min and value.max() <= info.max)


def _assign(array: np.ndarray, value: np.ndarray) -> None:
    array[...] = value


def _overflowed(before: np.ndarray, after: np.ndarray) -> bool:
    """Whether a cast to float16 made a finite value of ``before`` infinite."""
    if after.dtype != np.float16 or not after.size:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.any(np.isinf(after) & np.isfinite(before)))


def _refuse_held_modules(name: str, value) -> None:
    """TypeError when ``value`` (a list, tuple or dict assigned as attribute ``name``) holds a
    Module: PyTorch silently leaves such modules unregistered (no parameters(), no state_dict,
    no train/eval), which here is an error naming the container to use instead."""
    items = value.values() if isinstance(value, dict) else value
    if not any(isinstance(item, Module) for item in items):
        return      # empty, or no modules (sizes, names, arrays): an ordinary attribute
    kind = type(value).__name__
    fix = "lk.ModuleDict({...})" if isinstance(value, dict) else "lk.ModuleList([...])"
    raise TypeError(f"'{name}' is a {kind} holding Module(s): its parameters would not be "
                    f"registered (parameters(), state_dict(), optimizers and train()/eval() "
                    f"would not see them); use {fix}")


@_closures.opaque     # a closure walk (the ledger, detect_anomaly) stops at a module
class Module:
    """Base class of every layer, container and loss.

    Subclasses call ``super().__init__()`` and define ``forward(x)`` and ``vjp(x, input_grad=True)``.
    Parameters, buffers and submodules assigned as attributes are registered in assignment order.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_hooks", None)  # a hooks.HookSet once a hook is registered

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        vjp = cls.__dict__.get("vjp")
        if vjp is not None and not hasattr(vjp, "__wrapped_vjp__"):
            cls.vjp = guarded_vjp(vjp)

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value) -> None:
        # any attribute (a child, a Parameter, the class) may be structure; the object it already
        # holds is no change (``self.num_batches_tracked += 1``: an in-place add, then this)
        if self.__dict__.get(name, _ABSENT) is not value:
            _structure.changed()
        if isinstance(value, (list, tuple, dict)) and not isinstance(value, Module):
            _refuse_held_modules(name, value)
        params = self.__dict__.get("_parameters")
        if params is None and isinstance(value, (Parameter, Module)):
            raise AttributeError(
                f"cannot assign {type(value).__name__} '{name}' before Module.__init__() is "
                "called; call super().__init__() first in your __init__"
            )
        if params is not None:
            if isinstance(value, Parameter):
                self._unregister(name, keep=params)
                params[name] = value
            elif isinstance(value, Module):
                self._unregister(name, keep=self._modules)
                self._modules[name] = value
            elif name in params:
                if value is not None:
                    raise TypeError(
                        f"cannot assign {type(value).__name__} as parameter '{name}' "
                        "(a Parameter or None is expected); wrap arrays: Parameter(array)"
                    )
                params[name] = None
            elif name in self._modules:
                if value is not None:
                    raise TypeError(f"cannot assign {type(value).__name__} as child module '{name}'")
                self._modules[name] = None
            elif name in self._buffers:
                if value is not None:
                    value = np.asarray(value)
                self._buffers[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._unregister(name)
        object.__delattr__(self, name)

    def _unregister(self, name: str, keep: dict | None = None) -> None:
        """Forget ``name`` in every registry but ``keep`` (where it keeps its position)."""
        _structure.changed()
        for registry in (self._parameters, self._buffers, self._modules):
            if registry is not keep:
                registry.pop(name, None)
        self._non_persistent.discard(name)

    def _check_name(self, kind: str, name, registry: str) -> None:
        """Refuse ``name`` for a new ``kind`` ('module', 'parameter', 'buffer') as PyTorch's
        ``add_module`` / ``register_*`` do: TypeError unless a str; KeyError when it is empty,
        holds a '.' (state-dict keys and paths are dotted) or is already an attribute that is
        not an entry of ``registry`` (``forward``, ``training``, ``state_dict``,
        ``_parameters``, a child registered as another kind...), which it would shadow."""
        if registry not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call; call "
                                 "super().__init__() first in your __init__")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if hasattr(self, name) and name not in self.__dict__[registry]:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (or a None placeholder, e.g. ``bias=False``) under ``name``.

        ``name``: a str, not empty, without '.', and not an attribute the module already has
        (other than a parameter of that name): else KeyError/TypeError, as PyTorch."""
        self._check_name("parameter", name, "_parameters")
        self._unregister(name, keep=self._parameters)
        self._parameters[name] = param
        object.__setattr__(self, name, param)

    def register_buffer(self, name: str, array, persistent: bool = True) -> None:
        """Register a non-trainable array (e.g. running statistics) saved in ``state_dict``.

        ``name`` follows ``register_parameter``'s rule (an existing buffer may be replaced)."""
        self._check_name("buffer", name, "_buffers")
        self._unregister(name, keep=self._buffers)
        array = None if array is None else np.asarray(array)
        self._buffers[name] = array
        if not persistent:
            self._non_persistent.add(name)
        object.__setattr__(self, name, array)

    def add_module(self, name: str, module: Module | None) -> None:
        """Register a child module under ``name`` (replacing the child of that name, if any).

        As PyTorch's ``add_module``: TypeError for a non-Module or a non-str name; KeyError for
        an empty name, a name with '.', or one that is already an attribute other than a child
        (``forward``, ``training``, ``state_dict``, ``_parameters``, a parameter...). Numeric
        names (``'0'``, as Sequential's) are fine."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_name("module", name, "_modules")
        self._unregister(name, keep=self._modules)
        self._modules[name] = module
        object.__setattr__(self, name, module)

    # ------------------------------------------------------------------ traversal
    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True
                      ) -> Iterator[tuple[str, Module]]:
        """Yield ``(path, module)`` for this module and every descendant, each once."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            child_prefix = f"{prefix}.{name}" if prefix else name
            yield from child.named_modules(memo, child_prefix, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        """Yield this module and every descendant, depth first, each instance once.

        >>> import linearkit as lk
        >>> [type(m).__name__ for m in lk.Sequential(lk.Linear(2, 3), lk.ReLU()).modules()]
        ['Sequential', 'Linear', 'ReLU']
        """
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def get_submodule(self, target: str) -> Module:
        """The descendant at the dotted path ``target`` (``'encoder.0'``; ``''`` is this module),
        as PyTorch's ``get_submodule``; an AttributeError names the first missing step."""
        if target == "":
            return self
        module = self
        steps = target.split(".")
        for depth, name in enumerate(steps):
            child = module._modules.get(name)
            if child is None:
                where = f"'{'.'.join(steps[:depth])}'" if depth else "the root"
                there = ", ".join(n for n, _ in module.named_children()) or "none"
                raise AttributeError(f"{type(self).__name__}.get_submodule({target!r}): {where} "
                                     f"({type(module).__name__}) has no child module {name!r}; "
                                     f"its children are: {there}")
            module = child
        return module

    def _named_members(self, registry: str, prefix: str, recurse: bool, remove_duplicate: bool):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, Parameter]]:
        """Yield ``(path, Parameter)``; a tied Parameter is yielded once, under its first path."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Yield every Parameter (this module's own only, with ``recurse=False``), tied ones once.

        >>> import linearkit as lk
        >>> [p.shape for p in lk.Linear(2, 3).parameters()]
        [(3, 2), (3,)]
        """
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                      ) -> Iterator[tuple[str, np.ndarray]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[np.ndarray]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call ``fn`` on every submodule (children first) and then on self, as in PyTorch."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ modes and grads
    def train(self, mode: bool = True) -> Module:
        """Set training mode (Dropout drops, BatchNorm uses batch statistics) recursively."""
        if not isinstance(mode, bool):
            raise TypeError("training mode is expected to be a bool")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode recursively; same as ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Freeze (False) or unfreeze (True) every parameter. A frozen weight costs no dW GEMM."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's ``.grad`` to None (default) or fill it with zeros in place."""
        if not self._modules:    # a leaf (a Linear): its own parameters, without the tree walk
            for p in self._parameters.values():
                if p is not None:
                    p.zero_grad(set_to_none)
            return
        for p in self.parameters():
            p.zero_grad(set_to_none)

    def to(self, dtype) -> Module:
        """Convert every floating parameter and buffer to ``dtype`` in place; returns self.

        ``dtype``: a storage dtype — float32, float64, float16 or bfloat16 (``"bfloat16"``,
        ``ml_dtypes.bfloat16``; see ``linearkit.precision``). As PyTorch's ``.to(dtype)``:
        floating parameters and buffers (BatchNorm's running statistics) are converted, integer
        buffers (``num_batches_tracked``) are not; values round to nearest even. A gradient
        becomes the dtype a new one would have under the precision policy (float32 for 16-bit
        parameters by default).

        ``to(None)`` raises TypeError. PyTorch's ``Module.to(None)`` is a no-op (its ``to`` also
        takes a device, and None means "leave it"); linearkit's ``to`` takes only a dtype, so
        None can only be a missing value (an unset option), and NumPy would read it as
        float64. Raising keeps PyTorch's promise — None never changes the dtype — and says so.
        """
        if dtype is None:
            raise TypeError("Module.to(None): expected a storage dtype (float32, float64, "
                            "float16 or bfloat16), got None; PyTorch treats None as 'leave the "
                            "dtype', linearkit refuses it rather than guess (np.dtype(None) "
                            "would be float64). Omit the call to keep the current dtype.")
        precision = _precision
        dtype = precision.storage_dtype(dtype)
        grad_dtype = precision.grad_dtype(dtype)
        overflowed = []         # float16 only: finite values that became inf
        for path, module in self.named_modules():
            prefix = path + "." if path else ""
            for name, p in module._parameters.items():
                if p is not None and precision.is_float(p.data.dtype):
                    with np.errstate(over="ignore"):    # said once, below, with the names
                        data = p.data.astype(dtype)
                    if _overflowed(p.data, data):
                        overflowed.append(prefix + name)
                    p.data = data
                    p.grad = None if p.grad is None else p.grad.astype(grad_dtype)
            for name, b in module._buffers.items():
                if b is not None and precision.is_float(b.dtype):
                    with np.errstate(over="ignore"):
                        data = b.astype(dtype)
                    if _overflowed(b, data):
                        overflowed.append(prefix + name)
                    setattr(module, name, data)
            if hasattr(module, "dtype"):
                object.__setattr__(module, "dtype", dtype)
        if overflowed:
            warnings.warn(f"to({dtype}): {', '.join(overflowed)} held values beyond float16's "
                          f"range (±65504), now inf; bfloat16 keeps float32's range",
                          UserWarning, stacklevel=2)
        return self

    # PyTorch's dtype shortcuts, each ``self.to(dtype)``: same in-place conversion, same
    # precision policy (16-bit storage computes in float32), and returns self.
    def double(self) -> Module:
        """``to(np.float64)``: parameters and floating buffers stored and computed in float64
        (shapes unchanged); returns self, as ``torch.nn.Module.double``."""
        return self.to(np.float64)

    def float(self) -> Module:
        """``to(np.float32)``: parameters and floating buffers in float32 (shapes unchanged);
        returns self, as ``torch.nn.Module.float``."""
        return self.to(np.float32)

    def half(self) -> Module:
        """``to(np.float16)``: parameters and floating buffers stored in float16 (shapes
        unchanged); returns self, as ``torch.nn.Module.half``. Unlike PyTorch on a CPU, the
        arithmetic runs in float32 (``linearkit.precision``: 16-bit storage, float32 compute
        and float32 ``.grad`` by default); values beyond ±65504 become inf, with a warning."""
        return self.to(np.float16)

    def bfloat16(self) -> Module:
        """``to("bfloat16")``: parameters and floating buffers stored in bfloat16 (shapes
        unchanged; needs ``ml_dtypes``); returns self, as ``torch.nn.Module.bfloat16``. The
        arithmetic runs in float32 (``linearkit.precision``), with float32 ``.grad``."""
        return self.to("bfloat16")

    # ------------------------------------------------------------------ state dict
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict[str, object]:
        """PyTorch's keys (``0.weight``, ``bn.running_mean``) mapped to arrays (shared, not copied).

        A module reachable under two names appears under both, as in PyTorch.
        ``keep_vars=True`` returns the Parameter objects instead of their arrays.
        """
        destination: OrderedDict = OrderedDict()
        self._save_into(destination, prefix, keep_vars)
        return destination

    def _save_into(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.data
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                destination[prefix + name] = b
        for name, child in self._modules.items():
            if child is not None:
                child._save_into(destination, f"{prefix}{name}.", keep_vars)

    def load_state_dict(self, state_dict, strict: bool = True, layout: str = "out_in"
                        ) -> IncompatibleKeys:
        """Copy arrays from ``state_dict`` into this model's parameters and buffers, in place.

        Values may be ndarrays or anything ``np.asarray`` accepts (torch tensors included); they
        are cast to the parameter's dtype. As in PyTorch: a size mismatch always raises
        ``RuntimeError`` listing every mismatch; with ``strict=True`` missing and unexpected keys
        raise too; a one-element array loads into a 0-d buffer (old checkpoints); the return
        value is ``(missing_keys, unexpected_keys)``.

        Transactional: every key, shape and value is checked before anything is assigned, so a
        load that raises leaves the model exactly as it was (a LazyLinear stays lazy), and the
        message names every offending key. A value that cannot be cast losslessly in kind (a
        string, an object, a complex array into a real parameter) is such an error, and so is
        a value an integer buffer would change (a fraction or an out-of-range number into int8).

        ``layout`` states how the checkpoint stores Linear weights: ``"out_in"`` (PyTorch's
        ``(out_features, in_features)``, the default) or ``"in_out"`` (Keras, Flax,
        scikit-learn, hand-written NumPy kernels ``(in_features, out_features)``). With
        ``"in_out"`` exactly the keys the layer rules name transposable are transposed before
        any check (``LayerRule.transposable_keys``: the ``weight`` of every ``Linear`` and
        LazyLinear) — never a guess from shapes, so a 2-D LayerNorm weight is left alone — and
        shape errors still name the key.
        """
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        if layout not in ("out_in", "in_out"):
            raise ValueError(f"layout must be 'out_in' (PyTorch's (out_features, in_features)) "
                             f"or 'in_out' ((in_features, out_features) kernels), got {layout!r}")
        if layout == "in_out":
            state_dict = self._linear_weights_transposed(state_dict)
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []
        actions: list[Callable[[], None]] = []

        def plan(module: Module, prefix: str) -> None:
            module._plan_load(state_dict, prefix, missing, unexpected, errors, actions)
            for name, child in module._modules.items():
                if child is not None:
                    plan(child, f"{prefix}{name}.")

        try:  # the arrays a load creates (a LazyLinear's) are allocated while planning
            plan(self, "")
        except AllocationError as err:
            err.locate(self)
            raise
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            if layout == "in_out":
                errors.append("(layout='in_out': Linear weights were transposed to "
                              "(out_features, in_features) before these checks)")
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        for action in actions:  # nothing failed: now change the model
            action()
        return IncompatibleKeys(missing, unexpected)

    def _linear_weights_transposed(self, state_dict) -> dict:
        """A shallow copy of ``state_dict`` whose Linear weight keys hold their transposes.

        The keys come from the model (every name of every module whose rule lists
        ``transposable_keys``, shared ones included), never from the values' shapes; a value
        that is not 2-D is left as it is for the checks to report under its key.
        """
        # The registry, not linearkit.layers: the base class imports no layer (the registry
        # imports nothing from layers or core; loading it registers the shipped rules).
        from ..rules.registry import transposable_keys

        kernels = {prefix + ("." if prefix else "") + key
                   for prefix, m in self.named_modules(remove_duplicate=False)
                   for key in transposable_keys(m)}
        copied = {}
        for key in state_dict.keys():
            value = state_dict[key]
            if key in kernels:
                try:
                    array = np.asarray(value)
                except Exception:  # noqa: BLE001 - reported by _loadable under this key
                    array = None
                if array is not None and array.ndim == 2:
                    value = array.T
            copied[key] = value
        return copied

    def _local_state(self) -> dict:
        state = {n: p for n, p in self._parameters.items() if p is not None}
        state.update((n, b) for n, b in self._buffers.items()
                     if b is not None and n not in self._non_persistent)
        return state

    def _load_targets(self, state_dict, prefix: str, errors: list[str]):
        """This module's own loadable entries and an action to run before they are assigned.

        Returns ``({name: (shape, dtype, array getter)}, prepare)``. Getters are called only when
        the load is applied, after ``prepare`` (None here; a LazyLinear materializes in it).
        """
        targets = {}
        for name, value in self._local_state().items():
            array = value.data if isinstance(value, Parameter) else value
            targets[name] = (array.shape, array.dtype, lambda array=array: array)
        return targets, None

    def _plan_load(self, state_dict, prefix, missing, unexpected, errors, actions) -> None:
        """Check this module's own entries (not its children's) against ``state_dict``.

        Appends to ``missing``/``unexpected``/``errors`` and, for each entry that will load, an
        assignment to ``actions``; changes nothing itself.
        """
        targets, prepare = self._load_targets(state_dict, prefix, errors)
        if prepare is not None:
            actions.append(prepare)
        for name, (shape, dtype, array_of) in targets.items():
            key = prefix + name
            if key not in state_dict:
                missing.append(key)
                continue
            if array_of is None:  # an entry that cannot load (its error is already reported)
                continue
            value = _loadable(state_dict[key], key, shape, dtype, errors)
            if value is not None:
                actions.append(lambda array_of=array_of, value=value: _assign(array_of(), value))
        for key in state_dict.keys():
            if not isinstance(key, str) or not key.startswith(prefix):
                continue
            head = key[len(prefix):].split(".", 1)
            if len(head) > 1:
                if head[0] not in self._modules:
                    unexpected.append(key)
            elif head[0] not in targets:
                unexpected.append(key)

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        """The computation ``module(x)`` runs: input(s) to output, keeping nothing for a backward.

        Subclasses define it (``x (*, in) -> y (*, out)`` for the shipped layers). Call the
        module, not ``forward``: ``module(x)`` also runs the call hooks and locates errors.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no forward(); define forward(self, x) in your subclass")

    def vjp(self, *args, **kwargs):
        """``(y, backward)``: the forward plus a closure for the vector-Jacobian product.

        ``vjp(x, input_grad=True)`` returns ``y`` (the same array ``module(x)`` would) and
        ``backward(dy) -> dx``, where ``dy`` has ``y``'s shape and ``dx`` has ``x``'s (None when
        ``input_grad=False``). Calling ``backward`` adds each trainable parameter's gradient into
        its ``.grad`` (through ``Parameter.add_grad``), once: a second call raises. Which
        parameters get a gradient is fixed when ``vjp`` runs. Subclasses define it by composing
        their children's closures (see docs/custom_modules.md).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no vjp(); define vjp(self, x, input_grad=True) returning "
            "(y, backward) — compose your submodules' vjp closures (see docs/custom_modules.md)")

    def __call__(self, *args, **kwargs):
        """Run ``forward`` (keeping nothing for a backward), with the call hooks around it."""
        hooked = _hooks.active or self._hooks
        if hooked:
            args, kwargs = _hooks.run_forward_pre(self, args, kwargs)
        try:
            y = self.forward(*args, **kwargs)
        except Located as err:
            err.locate(self)
            raise
        if _anomaly.enabled:
            check_finite(self, y, "forward")
        if hooked:
            y = _hooks.run_forward(self, args, kwargs, y, replace_ok=True)
        return y

    # ------------------------------------------------------------------ call hooks
    def has_hooks(self) -> bool:
        """Whether a call hook (forward pre-hook, forward hook or backward hook) is registered
        on this module itself (global hooks: ``linearkit.hooks.active``)."""
        hooks = self._hooks
        return hooks is not None and bool(hooks)

    def _hook_set(self) -> _hooks.HookSet:
        if self._hooks is None:
            object.__setattr__(self, "_hooks", _hooks.HookSet(self))
        return self._hooks

    def register_forward_pre_hook(self, hook: Callable, *, with_kwargs: bool = False
                                  ) -> _hooks.RemovableHandle:
        """``hook(module, args) -> None | new args`` runs before each ``module(x)`` / ``vjp(x)``.

        With ``with_kwargs=True`` it is ``hook(module, args, kwargs) -> None | (args, kwargs)``
        (under ``vjp`` the kwargs hold ``input_grad``). Returns a handle; ``handle.remove()``.
        """
        return self._hook_set().add("forward_pre", hook, with_kwargs)

    def register_forward_hook(self, hook: Callable, *, with_kwargs: bool = False
                              ) -> _hooks.RemovableHandle:
        """``hook(module, args, output) -> None | new output`` runs after each call.

        Fired for ``module(x)`` and ``module.vjp(x)`` (where ``output`` is ``y``, and a
        replacement raises). ``with_kwargs=True``: ``hook(module, args, kwargs, output)``.
        """
        return self._hook_set().add("forward", hook, with_kwargs)

    def register_full_backward_pre_hook(self, hook: Callable) -> _hooks.RemovableHandle:
        """``hook(module, grad_output) -> None | new grad_output`` runs before the backward."""
        return self._hook_set().add("backward_pre", hook)

    def register_full_backward_hook(self, hook: Callable) -> _hooks.RemovableHandle:
        """``hook(module, grad_input, grad_output) -> None | new grad_input`` after the backward.

        ``grad_output = (dy,)``; ``grad_input = (dx,)``, ``(None,)`` under ``input_grad=False``.
        """
        return self._hook_set().add("backward", hook)

    # ------------------------------------------------------------------ printing
    def extra_repr(self) -> str:
        """The text between the parentheses of this module's repr (PyTorch's convention)."""
        return ""

    def _signature(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): {_addindent(repr(child), 2)}"
                       for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        text = type(self).__name__ + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"
