"""The ledger's PyTorch path: hooks record every module call, saved-tensor hooks weigh backward.

Forward pre/post hooks give each call's input and output shape and whether its input requires a
gradient (so the dX GEMM is counted exactly when autograd would run it). What autograd keeps for
backward is not estimated but measured: ``torch.autograd.graph.saved_tensors_hooks`` sees every
tensor saved during one forward, which is charged to the innermost module running, each storage
once, parameters excluded. The model is left as it was: buffers (BatchNorm running statistics)
are restored, the RNG is forked, a model with lazy modules is run on a copy.
torch is imported only here. A torch module is costed with the rule of the linearkit layer
whose torch twin it is (``linearkit.rules.torch_twin_of``; the shipped twins are in
``linearkit/rules/torch_rules.py``): the rules' costs read only attributes both sides share.
"""

from __future__ import annotations

import copy

from ...errors import ShapeError
from ...rules import rule_for, torch_twin_of
from .accumulator import Acc

__all__ = ["torch_pass"]


def _first_tensor(out, torch):
    if torch.is_tensor(out):
        return out
    if isinstance(out, (list, tuple)):
        for o in out:
            t = _first_tensor(o, torch)
            if t is not None:
                return t
    if isinstance(out, dict):
        return _first_tensor(list(out.values()), torch)
    return None


def _describe(m, nn) -> tuple[str, str]:
    """(type text, kind) of a torch module: its twin's text and its linearkit rule's kind, or
    its class name and 'container' (it has children) / 'unknown'."""
    twin = torch_twin_of(m)
    rule = None if twin is None else rule_for(twin[0])
    if rule is not None:
        layer_type, found = twin
        return found.text(m, layer_type), rule.kind
    return type(m).__name__, "container" if any(True for _ in m.children()) else "unknown"


def _cost(m, kind, xs, need_dx):
    """The cost of torch module ``m`` of ``kind``, by its linearkit twin's rule; None: no rule."""
    if kind == "container":
        return (0,) * 6  # a torch container's own share; its children are rows of their own
    twin = torch_twin_of(m)
    rule = None if twin is None else rule_for(twin[0])
    return None if rule is None or rule.cost is None else rule.cost(m, xs, need_dx)


def _is_lazy(p, nn) -> bool:
    return isinstance(p, nn.parameter.UninitializedParameter)


def _own(m, nn) -> list:
    """[(key, numel, trainable)] of ``m``'s own parameters; an uninitialized one counts 0."""
    return [(id(p), 0 if _is_lazy(p, nn) else p.numel(), p.requires_grad)
            for p in m.parameters(recurse=False)]


def _linear_info(m) -> dict:
    return {"in": m.in_features, "out": m.out_features, "bias": m.bias is not None}


def torch_pass(model, shape, override):
    """-> (acc, sizes) for a torch ``nn.Module`` (``sizes`` as ``linearkit_pass``'s).

    PyTorch's semantics: gradients, activations and optimizer states in the parameters' dtype
    (or the override's); under ``master_dtype='auto'`` a 16-bit model is counted with float32
    master weights and states, as mixed-precision recipes keep them.
    """
    try:
        import torch
        from torch import nn
    except ImportError:  # pragma: no cover - only reached with a torch model in hand
        raise ImportError("a PyTorch model needs torch: pip install 'linearkit[torch]'") from None
    params = [p for p in model.parameters() if not _is_lazy(p, nn)]
    pdtype = params[0].dtype if params else torch.get_default_dtype()
    device = params[0].device if params else torch.device("cpu")
    native = torch.empty((), dtype=pdtype).element_size()
    itemsize = override.itemsize if override is not None else native
    store = override.name if override is not None else str(pdtype).replace("torch.", "")
    buffers = sum(b.numel() * (itemsize if b.is_floating_point() else b.element_size())
                  for b in model.buffers())
    acc = Acc(itemsize)
    sizes = {"weights": 0, "buffers": buffers, "store": store, "params": []}
    for p in params:  # model.parameters() gives a tied parameter once
        size = itemsize if override is not None else p.element_size()
        sizes["params"].append((p.numel(), size, size, bool(p.requires_grad)))
        sizes["weights"] += p.numel() * size
    if shape is None:
        _tree_rows(model, acc, nn)
        return acc, sizes

    lazy = any(_is_lazy(p, nn) for p in model.parameters())
    target = copy.deepcopy(model) if lazy else model
    originals = dict(model.named_modules())
    target_paths = {id(m): n for n, m in target.named_modules()}
    calls, stack, saved, handles = [], [], [], []

    def pre(mod, args):
        x = _first_tensor(args, torch)
        calls.append({"module": mod, "parent": stack[-1] if stack else None,
                      "depth": len(stack), "x": x, "y": None})
        stack.append(len(calls) - 1)

    def post(mod, args, out):
        calls[stack.pop()]["y"] = _first_tensor(out, torch)

    def param_storages():  # parameters and buffers are counted elsewhere, not as activations
        tensors = [p for p in target.parameters() if not _is_lazy(p, nn)] + list(target.buffers())
        return {t.untyped_storage().data_ptr() for t in tensors}

    fixed = None if lazy else param_storages()

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in (fixed if fixed is not None else param_storages()):
            nbytes = storage.nbytes()
            if t.is_floating_point():
                nbytes = nbytes * itemsize // t.element_size()
            saved.append((stack[-1] if stack else 0, ptr, nbytes))
        return t

    for m in target.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    kept = {n: b.detach().clone() for n, b in target.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x0 = torch.zeros(shape, dtype=pdtype, device=device)
            try:
                target(x0)
            except (RuntimeError, ValueError, IndexError, TypeError) as exc:
                culprit = calls[stack[-1]]["module"] if stack else target
                path = target_paths.get(id(culprit), "")
                where = f"module '{path}' ({culprit.__class__.__name__})" if path else \
                    culprit.__class__.__name__
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise ShapeError(f"{where}: {first} (input of shape {tuple(shape)})") from None
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for n, b in target.named_buffers():
                if n in kept:
                    b.copy_(kept[n])

    rows = []
    for call in calls:
        m = call["module"]
        path = target_paths.get(id(m), "?")
        orig = originals.get(path, m)
        type_, kind = _describe(orig, nn)
        x, y = call["x"], call["y"]
        xs = None if x is None else tuple(x.shape)
        ys = None if y is None else tuple(y.shape)
        i = acc.row(path, type_, call["depth"], kind=kind, input_shape=xs, output_shape=ys,
                    output_bytes=None if y is None else y.numel() * itemsize)
        rows.append(i)
        acc.own_params(i, _own(orig, nn))
        if any(_is_lazy(p, nn) for p in orig.parameters(recurse=False)):
            acc.rows[i].note = "uninitialized (in_features=?)"
        if kind == "linear":
            acc.rows[i].info = _linear_info(m)
            if not _is_lazy(orig.weight, nn):
                acc.linear_weights[i] = orig.weight.detach().float().cpu().numpy()
        elif kind == "batchnorm":
            acc.rows[i].info = {"c": m.num_features}
        cost = None if xs is None else _cost(m, kind, xs, bool(x.requires_grad))
        if cost is None:
            if kind == "unknown":
                acc.unaccounted.append(path)
        else:
            acc.add_cost(i, cost)
    for owner, ptr, nbytes in saved:
        acc.keep(rows[owner], ("storage", ptr), nbytes)
    for idx in range(len(calls) - 1, -1, -1):
        parent = calls[idx]["parent"]
        if parent is not None:
            acc.roll_up(rows[parent], [rows[idx]])
    for idx, call in enumerate(calls):
        if acc.rows[rows[idx]].kind == "sequential":
            acc.chains.append((rows[idx], [rows[j] for j, c in enumerate(calls)
                                           if c["parent"] == idx]))
    called = {target_paths.get(id(c["module"])) for c in calls}
    for path, m in model.named_modules():  # parameters of modules forward never reached
        if path not in called:
            own = _own(m, nn)
            if own:
                i = acc.row(path, _describe(m, nn)[0], path.count(".") + 1, kind="unused",
                            note="not called by forward")
                acc.own_params(i, own)
                acc.rows[0].params += acc.rows[i].params
                acc.rows[0].trainable_params += acc.rows[i].trainable_params
    return acc, sizes


def _tree_rows(model, acc, nn) -> None:
    """Without an input: one row per module, parameters only."""
    index = {}
    for path, m in model.named_modules():
        type_, kind = _describe(m, nn)
        i = acc.row(path, type_, 0 if not path else path.count(".") + 1, kind=kind)
        index[path] = i
        acc.own_params(i, _own(m, nn))
        if kind == "linear" and not _is_lazy(m.weight, nn):
            acc.rows[i].info = _linear_info(m)
            acc.linear_weights[i] = m.weight.detach().float().cpu().numpy()
    for path in sorted(index, key=lambda p: -p.count(".") if p else 1):
        if path:
            parent = path.rpartition(".")[0]
            acc.roll_up(index[parent], [index[path]])

