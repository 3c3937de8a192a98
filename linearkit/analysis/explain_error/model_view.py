"""The model side of ``explain``: find the layer an error came from.

Three ways, most exact first:

* the traceback of the exception object: the innermost frame whose ``self`` is a module of the
  model is the one that was running (no rerun);
* a shape walk on the input's shape: a linearkit model (or a torch model that
  ``linearkit.io.from_torch`` converts, paths unchanged) goes through the ledger's shape-only
  pass, which raises the layer's own ShapeError; a torch model that does not convert (a custom
  ``forward``, a conv layer, a weight replaced by one of another shape) runs once on zeros with
  forward hooks, and the innermost module still running when it raised is the one;
* matching the numbers of the message against the layers (a weight of that shape, a LayerNorm of
  that width), when neither of the above is possible.

Module facts are read through attributes both frameworks share (``in_features``,
``weight.shape``, ``normalized_shape``, ``num_features``), so every check works on both.
torch is imported only for a torch model.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...core.module import Module
from ...errors import Located

__all__ = ["Failure", "ModelView", "as_model", "is_torch_module", "shape_of"]


def is_torch_module(obj) -> bool:
    """Whether ``obj`` is a torch ``nn.Module`` (by its class's module, importing nothing)."""
    return any((c.__module__ or "").startswith("torch.nn") for c in type(obj).__mro__) and \
        hasattr(obj, "named_modules")


def as_model(model):
    """``model`` itself, or the model a linearkit model file describes (``linearkit.save``)."""
    if isinstance(model, str | os.PathLike):
        from ...io.model_file import load_model

        return load_model(model)
    if model is not None and not isinstance(model, Module) and not is_torch_module(model):
        raise TypeError(f"model must be a linearkit Module, a torch nn.Module or a model file, "
                        f"got {type(model).__name__}")
    return model


def shape_of(value) -> tuple | None:
    """The shape of an array or tensor as a tuple of ints; None for anything else."""
    shape = getattr(value, "shape", None)
    try:
        return None if shape is None else tuple(int(d) for d in shape)
    except TypeError:
        return None


@dataclass
class Failure:
    """Where a run of the model on the input failed: the module's path and the module, and the
    shape of the input that module received (None when unknown)."""

    path: str | None
    module: object
    incoming: tuple | None


_GOT = re.compile(r"got \(([\d,\s]*)\)")


def _ints(text: str) -> tuple:
    return tuple(int(t) for t in re.findall(r"-?\d+", text))


class ModelView:
    """A linearkit or torch model, with its modules by path and the ways to find a failure."""

    def __init__(self, model):
        self.model = model
        self.is_torch = is_torch_module(model)
        self.by_path = dict(model.named_modules())
        self._paths = {}
        for path, module in self.by_path.items():
            self._paths.setdefault(id(module), path)  # a shared module: its first name

    def path_of(self, module) -> str | None:
        return self._paths.get(id(module))

    def find(self, test) -> list:
        """``[(path, module)]`` of the modules for which ``test(module)`` holds, in order."""
        return [(p, m) for p, m in self.by_path.items() if passes(test, m)]

    def linears(self) -> list:
        """``[(path, module)]`` of every layer with ``in_features``, ``out_features`` and a 2-D
        weight (Linear, LoRALinear, QuantizedLinear... on either side), in order."""
        return self.find(lambda m: hasattr(m, "in_features") and hasattr(m, "out_features")
                         and weight_shape(m) is not None)

    # -- locating --------------------------------------------------------------------------

    def from_traceback(self, exc) -> Failure | None:
        """The innermost module of this model running when ``exc`` was raised (its frame's
        ``self``), with the shape of the first argument of its ``forward``."""
        tb, found = getattr(exc, "__traceback__", None), None
        while tb is not None:
            frame, code = tb.tb_frame, tb.tb_frame.f_code
            names = code.co_varnames[:code.co_argcount]  # a method's first one is its self
            me = frame.f_locals.get(names[0]) if names else None
            path = None if me is None else self.path_of(me)
            if path is not None:
                arg = frame.f_locals.get(names[1]) if len(names) > 1 else None
                found = Failure(path, me, shape_of(arg))
            tb = tb.tb_next
        return found

    def walk(self, input_shape, x=None) -> Failure | None:
        """Propagate ``input_shape`` (or run ``x``) through the model; the first failure, or
        None when the whole model takes the input."""
        if not self.is_torch:
            return _walk_linearkit(self, input_shape)
        try:
            from ...io.torch import from_torch

            converted = ModelView(from_torch(self.model))
        except Exception:  # noqa: BLE001 - no twin for a layer, a replaced weight: run torch
            converted = None
        if converted is not None and x is None:
            found = _walk_linearkit(converted, input_shape)
            if found is not None:  # the same paths: name the torch module
                return Failure(found.path, self.by_path.get(found.path), found.incoming)
        return _walk_torch(self, input_shape, x)


def passes(test, m) -> bool:
    """``test(m)``, False when it raises (a user's module may hold an attribute of the same
    name and another meaning)."""
    try:
        return bool(test(m))
    except Exception:  # noqa: BLE001 - an attribute of another meaning on a user's module
        return False


def weight_shape(m) -> tuple | None:
    """The shape of ``m.weight`` when it is a 2-D array or tensor, else None."""
    shape = shape_of(getattr(m, "weight", None))
    return shape if shape is not None and len(shape) == 2 else None


def _walk_linearkit(view: ModelView, input_shape) -> Failure | None:
    """The ledger's shape pass over a linearkit model: a layer's own ShapeError names it; any
    other error (a module without a rule is run once on zeros) is located by its traceback."""
    from ..ledger import ledger

    try:
        ledger(view.model, input_shape, optimizer=None, rank_check=False)
    except Located as err:  # a layer's own check: it names the module
        if err.root is None:
            err.locate(view.model)
        got = _GOT.search(err.detail)
        return Failure(err.path, err.module, None if got is None else _ints(got.group(1)))
    except Exception as err:  # noqa: BLE001 - a user's module raised: where is in the traceback
        return view.from_traceback(err) or Failure(None, None, None)
    return None


def _walk_torch(view: ModelView, input_shape, x) -> Failure | None:
    """Run the torch model once on zeros of ``input_shape`` (or on ``x``): no grad, the CPU RNG
    forked, buffers (BatchNorm statistics) restored, a model with lazy layers run on a copy. The
    failing module is the innermost whose forward had started but not returned."""
    import copy

    import torch

    model = view.model
    if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in model.parameters()):
        model = copy.deepcopy(model)  # running would materialize the user's lazy layers
    paths = {}
    for path, m in model.named_modules():
        paths.setdefault(id(m), path)
    params = [p for p in model.parameters() if p.is_floating_point()
              and not isinstance(p, torch.nn.parameter.UninitializedParameter)]
    if x is None:
        dtype = params[0].dtype if params else torch.float32
        device = params[0].device if params else "cpu"
        x = torch.zeros(tuple(input_shape), dtype=dtype, device=device)
    elif not torch.is_tensor(x):
        x = torch.as_tensor(x)
    running, handles = [], []

    def before(module, args):
        running.append((module, shape_of(args[0]) if args else None))

    def after(module, args, out):
        running.pop()

    for m in model.modules():
        handles += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(x)
    except Exception:  # noqa: BLE001 - any error: the module running raised it
        if not running:
            return Failure(None, None, shape_of(x))
        module, incoming = running[-1]
        path = paths.get(id(module))
        return Failure(path, view.by_path.get(path, module), incoming)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
    return None
