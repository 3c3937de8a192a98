"""What the doctor examines: the model (as linearkit pieces), one batch, its targets and a loss.

``prepare(model, x, y, ...)`` turns what the user passed into a :class:`Subject`:

* a linearkit ``Module`` is examined as it is (every measurement runs on a copy);
* a model file path (``.safetensors`` written by ``linearkit.save``, ``.onnx``) is loaded;
* a PyTorch ``nn.Module`` goes through ``io.from_torch``. When a submodule has no linearkit
  twin, the largest subtrees that do convert become separate *pieces*; the unread modules are
  listed, and the others are answered for: each piece is examined on the input it really gets
  inside the torch model, with the gradient that really reaches its output (one torch forward
  and backward with hooks records both);
* without ``x``, a random probe: standard normal values of ``input_shape`` (or
  ``(64, in_features)`` of the first Linear), seeded; without ``y``, random targets.

torch is imported only when the model is a torch module.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from ... import precision as P
from ...core.module import Module
from ...errors import FormatError
from ...losses import CrossEntropyLoss, MSELoss

__all__ = ["DEFAULT_BATCH", "Piece", "Subject", "is_torch_module", "prepare"]

#: Rows of the random probe when neither ``x`` nor ``input_shape`` is given.
DEFAULT_BATCH = 64


@dataclass
class Piece:
    """One linearkit model examined on its own.

    ``path``: where it sits in the user's model ('' for the whole model); ``module``: the
    linearkit module (the user's own model, or a conversion of a torch subtree); ``x``: the input
    it receives, ``(B, *in)``; ``grad``: the gradient reaching its output (same shape as its
    output) for a torch piece, None for the whole model (the loss gives it).
    """

    path: str
    module: Module
    x: np.ndarray
    grad: np.ndarray | None = None

    def qualify(self, sub: str) -> str:
        """The user's path of ``sub``, a path inside this piece."""
        if not self.path:
            return sub
        return self.path if not sub else f"{self.path}.{sub}"


@dataclass
class Subject:
    """Everything the sections need.

    ``model``: the linearkit model when the whole model converted (else None); ``torch_model``:
    the torch module the user passed (else None); ``ledger_model``: what the ledger counts (the
    linearkit model, or the torch module when part of it could not be read); ``pieces``: the
    linearkit models examined, in forward order; ``unread``: ``[(path, type, reason)]`` of the
    torch modules ``from_torch`` could not read; ``x (B, *in)``, ``y``, ``loss_fn``: the batch,
    its targets and the loss; ``notes``: what was assumed (a random probe, a cast, ...).
    """

    name: str
    source: str
    model: Module | None
    torch_model: object | None
    ledger_model: object
    pieces: list[Piece]
    unread: list[tuple[str, str, str]]
    x: np.ndarray
    y: np.ndarray
    loss_fn: object
    probe: dict
    file: str | None = None
    notes: list[str] = field(default_factory=list)
    loss: float | None = None
    output_grad: np.ndarray | None = None


def is_torch_module(obj) -> bool:
    """True for a ``torch.nn.Module`` (torch is never imported to find out)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


# ---------------------------------------------------------------------------- the model
def _load_file(path: str) -> Module:
    from ...io.convert import load_any

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such model file")
    return load_any(path)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _split_torch(tm, path: str, pieces: list, unread: list) -> None:
    """Convert the largest subtrees of torch module ``tm`` that ``from_torch`` reads into
    ``pieces`` ``[(path, torch module, linearkit module)]``; record the others in ``unread``."""
    from ...io.torch import from_torch
    from ...rules import torch_twin_of

    try:
        converted = from_torch(tm)
    except FormatError as err:
        # from_torch speaks of the module it was given as "the root": here it is a submodule
        reason = " ".join(str(err).split()).replace(
            f"the root torch module ({type(tm).__name__})", "this module")
    else:
        if _rule_kind(converted) != "container":
            pieces.append((path, tm, converted))
            return
        # A ModuleList / ModuleDict is never called: its parent calls its children, so they are
        # the pieces (each gets its input inside the torch model).
        for name, child in tm.named_children():
            _split_torch(child, _join(path, name), pieces, unread)
        return
    children = list(tm.named_children())
    if torch_twin_of(tm) is None:  # this module's own forward is unknown to linearkit
        unread.append((path, type(tm).__name__,
                       reason if not children else
                       "its forward is not a layer linearkit knows (its children are read "
                       "one by one)"))
    for name, child in children:
        _split_torch(child, _join(path, name), pieces, unread)


def _rule_kind(m) -> str | None:
    """The kind the layer rules give ``m`` (None for a module without a rule, a torch one)."""
    from ...rules import rule_for

    try:
        return getattr(rule_for(m), "kind", None)
    except (TypeError, KeyError):
        return None


def _first_in_features(model) -> int | None:
    for _, m in model.named_modules():
        n = getattr(m, "in_features", None)
        # a linearkit layer by its rule's kind, a torch Linear by its class name
        linear = _rule_kind(m) == "linear" or type(m).__name__ == "Linear"
        if linear and isinstance(n, (int, np.integer)) and n > 0:
            return int(n)
    return None


def _model_dtype(model) -> np.dtype:
    """The compute dtype of the first floating parameter (float32 for 16-bit storage)."""
    for p in model.parameters():
        data = p.data if isinstance(model, Module) else p.detach()
        if isinstance(model, Module):
            return np.dtype(P.compute_dtype(data.dtype))
        name = str(data.dtype).replace("torch.", "")
        return np.dtype(name if name in ("float32", "float64") else "float32")
    return np.dtype(np.float32)


# ---------------------------------------------------------------------------- the batch
def _probe_x(x, input_shape, model, dtype, seed, notes) -> tuple[np.ndarray, dict]:
    if x is not None:
        arr = np.asarray(x)
        if arr.dtype != dtype:
            notes.append(f"x was {arr.dtype}; cast to {dtype}, the model's compute dtype.")
            arr = arr.astype(dtype)
        return arr, {"kind": "user", "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if input_shape is None:
        n_in = _first_in_features(model)
        if n_in is None:
            raise ValueError("doctor needs x (a batch) or input_shape=(batch, *features) for a "
                             "random probe: the model has no Linear to read in_features from")
        input_shape = (DEFAULT_BATCH, n_in)
    shape = (int(input_shape),) if isinstance(input_shape, (int, np.integer)) else \
        tuple(int(d) for d in input_shape)
    arr = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    notes.append(f"no x given: a random probe, standard normal of shape {shape} (seed {seed}); "
                 "pass a real batch for the data's own statistics.")
    return arr, {"kind": "random", "shape": list(shape), "dtype": str(dtype), "seed": seed}


def _targets(y, loss_fn, out_shape, seed, notes):
    """``(y, loss_fn, description)`` for an output of shape ``out_shape``."""
    rng = np.random.default_rng(seed + 1)
    if y is not None:
        y = np.asarray(y)
        if loss_fn is None:
            loss_fn = CrossEntropyLoss() if y.dtype.kind in "iu" else MSELoss()
        return y, loss_fn, {"kind": "user", "shape": list(y.shape)}
    classify = (loss_fn is None and len(out_shape) == 2 and out_shape[1] >= 2) or \
        hasattr(loss_fn, "ignore_index")     # a loss of class-index targets
    if classify:
        y = rng.integers(0, out_shape[-1], size=out_shape[0])
        loss_fn = loss_fn or CrossEntropyLoss()
        notes.append(f"no y given: random class labels in [0, {out_shape[-1]}) for "
                     f"{type(loss_fn).__name__}.")
    else:
        y = rng.standard_normal(out_shape).astype(np.float32)
        loss_fn = loss_fn or MSELoss()
        notes.append(f"no y given: random standard normal targets of shape {tuple(out_shape)} "
                     f"for {type(loss_fn).__name__}.")
    return y, loss_fn, {"kind": "random", "shape": list(y.shape)}


# ---------------------------------------------------------------------------- torch pieces
def _torch_run(tm, pieces, x, y, loss_fn, notes):
    """One forward and backward of torch module ``tm`` on ``x``: each piece's input and the
    gradient reaching its output (hooks on a deep copy, so ``tm`` is untouched), and the
    model's output ``(B, *out)``. Returns ``(inputs, grads, output)`` keyed by piece path."""
    import torch

    twin = copy.deepcopy(tm)
    index = dict(twin.named_modules())
    inputs, grads, handles = {}, {}, []

    def pre(path):
        def hook(mod, args):
            if path not in inputs and args and torch.is_tensor(args[0]):
                inputs[path] = args[0].detach().cpu().numpy().copy()
        return hook

    def post(path):
        def hook(mod, args, out):
            if torch.is_tensor(out) and out.requires_grad and path not in grads:
                grads[path] = None

                def keep(g, path=path):
                    grads[path] = g.detach().cpu().numpy().copy()
                out.register_hook(keep)
        return hook

    for path, _, _ in pieces:
        handles.append(index[path].register_forward_pre_hook(pre(path)))
        handles.append(index[path].register_forward_hook(post(path)))
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            xt = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_(True)
            out = twin(xt)
            out_np = out.detach().cpu().numpy()
            loss, back = loss_fn.vjp(out_np, y)
            dout = np.asarray(back(), dtype=out_np.dtype)
            out.backward(torch.from_numpy(dout))
    finally:
        for h in handles:
            h.remove()
    missing = [p for p, _, _ in pieces if grads.get(p) is None]
    if missing:
        notes.append("no gradient reached " + ", ".join(p or "(model)" for p in missing)
                     + " in the torch backward: those pieces are examined with a gradient of "
                       "ones at their output.")
    return inputs, grads, out_np, float(np.asarray(loss)), dout


def _order(pieces, inputs) -> list:
    """Pieces in the order the torch forward called them (uncalled ones dropped)."""
    return [p for p in pieces if p[0] in inputs]


# ---------------------------------------------------------------------------- prepare
def prepare(model, x=None, y=None, *, input_shape=None, loss_fn=None, seed: int = 0,
            ledger_output_shape=None) -> Subject:
    """The :class:`Subject` for ``model`` and its batch (see the module docstring).

    ``ledger_output_shape(model, input_shape) -> tuple``: the output shape without running the
    model (the ledger's shape pass), for random targets.
    """
    notes: list[str] = []
    file = None
    if isinstance(model, (str, os.PathLike)):
        file = os.fspath(model)
        model = _load_file(file)
        name, source = os.path.basename(file), "file"
    elif isinstance(model, Module):
        name, source = type(model).__name__, "linearkit"
    elif is_torch_module(model):
        name, source = type(model).__name__, "torch"
    else:
        raise TypeError(f"doctor() takes a linearkit Module, a torch nn.Module or a model file "
                        f"path, got {type(model).__name__}")
    dtype = _model_dtype(model)
    xb, probe = _probe_x(x, input_shape, model, dtype, seed, notes)
    if source != "torch":
        out_shape = ledger_output_shape(model, xb.shape)
        yb, loss, targets = _targets(y, loss_fn, out_shape, seed, notes)
        probe["targets"], probe["loss"] = targets, type(loss).__name__
        return Subject(name, source, model, None, model, [Piece("", model, xb)], [], xb, yb,
                       loss, probe, file, notes)

    raw, unread = [], []
    _split_torch(model, "", raw, unread)
    out_shape = ledger_output_shape(model, xb.shape)
    yb, loss, targets = _targets(y, loss_fn, out_shape, seed, notes)
    probe["targets"], probe["loss"] = targets, type(loss).__name__
    if not unread and len(raw) == 1:
        lk_model = raw[0][2]
        return Subject(name, source, lk_model, model, lk_model, [Piece("", lk_model, xb)], [],
                       xb, yb, loss, probe, file, notes)
    inputs, grads, _, loss_value, dout = _torch_run(model, raw, xb, yb, loss, notes)
    pieces = []
    for path, _, lk_piece in _order(raw, inputs):
        xi = inputs[path]
        if xi.dtype.kind != "f":  # an integer tensor (indices, pixels): the piece's dtype
            xi = xi.astype(_model_dtype(lk_piece))
        pieces.append(Piece(path, lk_piece, xi, grads.get(path)))
    notes.append("the torch model holds modules linearkit cannot read ("
                 + ", ".join(f"'{p}' ({t})" if p else f"the root ({t})" for p, t, _ in unread)
                 + "): the ledger counts the torch model itself; health, precision, correctness "
                   "and runtime answer for the converted parts, each on the input and gradient "
                   "it gets inside the torch model.")
    subject = Subject(name, source, None, model, model, pieces, unread, xb, yb, loss, probe,
                      file, notes)
    subject.loss, subject.output_grad = loss_value, dout
    return subject
