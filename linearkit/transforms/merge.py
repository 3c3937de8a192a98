"""``merge_linear``: a run of consecutive linear maps, nothing nonlinear between, as one Linear.

Two affine maps applied in turn are one affine map::

    y = (x W1ᵀ + b1) W2ᵀ + b2 = x (W2 W1)ᵀ + (W2 b1 + b2)

The product is ``W2 @ W1`` — the second layer's weight on the left. (Some tutorials write
``x(W1W2)ᵀ``: the wrong order, which only type-checks for square layers.)

Merging saves work only when the run does not pass through a narrow middle: ``Linear(d, r)``
then ``Linear(r, d)`` holds ``2dr + r + d`` values, the merged ``Linear(d, d)`` ``d² + d``. So
``merge_linear`` merges a run only when that saves parameters or FLOPs, unless ``force=True``,
and says in the report what it left and why.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..core.module import Module
from ..layers import Linear, Sequential
from ..rules import is_lazy, own_rule, rule_for
from .walk import Ties, copy_model, finish, linear_from, lists, named, replace_everywhere, uses

__all__ = ["merge_linear", "merge_weights"]

NAME = "merge_linear"


# ---------------------------------------------------------------- the array tier
def as_float64(a) -> np.ndarray:
    """``a`` as a float64 array (the transforms' arithmetic is float64, cast back at the end)."""
    return np.asarray(a, dtype=np.float64)


def bias_through(w2_64: np.ndarray, b1, b2) -> np.ndarray | None:
    """``W2 @ b1 + b2`` in float64: the bias of an affine map ``b1`` followed by ``(W2, b2)``
    (``w2_64`` float64 ``(out, mid)``; a missing bias counts as zeros; None when both are)."""
    if b1 is None and b2 is None:
        return None
    b = np.zeros(w2_64.shape[0]) if b1 is None else w2_64 @ as_float64(b1)
    return b if b2 is None else b + as_float64(b2)


def merge_weights(w1, b1, w2, b2):
    """Two affine maps ``y = (x W1ᵀ + b1) W2ᵀ + b2`` as one: ``(W, b)`` with ``y = x Wᵀ + b``.

    ``W = W2 @ W1`` and ``b = W2 @ b1 + b2`` — in that order: the layer applied second is on
    the left (not ``W1 @ W2``, as some tutorials write).

    Parameters
    ----------
    w1 : array ``(out1, in1)``
        The first layer's weight (PyTorch's layout, as ``Linear.weight``).
    b1 : array ``(out1,)`` or None
        The first layer's bias; None counts as zeros.
    w2 : array ``(out2, out1)``
        The second layer's weight: it takes the first one's ``out1`` outputs.
    b2 : array ``(out2,)`` or None
        The second layer's bias; None counts as zeros.

    Returns
    -------
    w : ndarray ``(out2, in1)``
    b : ndarray ``(out2,)``, or None when both ``b1`` and ``b2`` are None.
        Computed in float64, returned in ``w1``'s dtype (float64 if ``w1`` is not floating).

    Raises
    ------
    ValueError
        A weight that is not 2-D, ``w2`` whose input width is not ``w1``'s output width, or a
        bias whose shape is not its weight's output width.

    Examples
    --------
    By hand: ``W1`` maps 2 features to 3, ``W2`` maps those 3 to 2.

    >>> import numpy as np
    >>> from linearkit.transforms import merge_weights
    >>> w1 = np.array([[1., 0.], [0., 2.], [1., 1.]])     # (3, 2)
    >>> b1 = np.array([1., 1., 1.])
    >>> w2 = np.array([[1., 1., 0.], [0., 1., 1.]])       # (2, 3)
    >>> b2 = np.array([0., 1.])
    >>> w, b = merge_weights(w1, b1, w2, b2)
    >>> w                                                   # W2 @ W1, (2, 2)
    array([[1., 2.],
           [1., 3.]])
    >>> b                                                   # W2 @ b1 + b2
    array([2., 3.])
    >>> x = np.array([[1., -1.]])
    >>> bool(np.array_equal((x @ w1.T + b1) @ w2.T + b2, x @ w.T + b))
    True
    """
    w1, w2 = np.asarray(w1), np.asarray(w2)
    if w1.ndim != 2 or w2.ndim != 2:
        raise ValueError(f"merge_weights() takes 2-D weights (out, in); got w1 of shape "
                         f"{w1.shape} and w2 of shape {w2.shape}")
    (out1, _), (out2, mid) = w1.shape, w2.shape
    if mid != out1:
        raise ValueError(f"w2 has shape {w2.shape}, so it takes {mid} inputs, but w1 of shape "
                         f"{w1.shape} gives {out1} outputs: w2 must be (out2, {out1}); the "
                         "second layer's weight goes second")
    for name, b, n in (("b1", b1, out1), ("b2", b2, out2)):
        if b is not None and np.shape(b) != (n,):
            weight = "w1" if name == "b1" else "w2"
            raise ValueError(f"{name} has shape {np.shape(b)}, but {weight} has {n} outputs: "
                             f"{name} must be ({n},) or None")
    dtype = w1.dtype if np.issubdtype(w1.dtype, np.floating) else np.dtype(np.float64)
    w2_64 = as_float64(w2)
    w = w2_64 @ as_float64(w1)
    b = bias_through(w2_64, b1, b2)
    return w.astype(dtype), None if b is None else b.astype(dtype)


# ---------------------------------------------------------------- walking the chains
def join(prefix: str, name: str) -> str:
    """The path of child ``name`` of the module at ``prefix``."""
    return f"{prefix}.{name}" if prefix else name


def is_chain(module: Module, transform: str) -> bool:
    """Whether ``transform`` edits ``module``'s steps as one chain: its rule's kind is
    'sequential' and its own rule lists the transform (a plain ``Sequential``; a subclass may
    call its steps differently and is not edited)."""
    rule = rule_for(module)
    return rule is not None and rule.kind == "sequential" and lists(module, transform)


def edit_chains(root: Module, edit, transform: str = NAME) -> Module:
    """Call ``edit(path, steps)`` on every chain ``transform`` edits (``is_chain``: a plain
    ``Sequential``) in ``root``, innermost first.

    ``steps`` is the chain's ``[(name, module), ...]`` in call order. Where ``edit`` returns a
    new list, the chain is rebuilt as a Sequential from an OrderedDict of it (the names kept,
    the training mode kept) and put back at its path — at each of its paths, for a chain used
    at several (tied): one rebuilt chain, tied the same way; None leaves it as it is. Returns
    the root (a new one when the root itself was rebuilt).
    """
    where = uses(root)  # read before any edit: the names a rebuilt chain keeps keep them valid
    chains = [(path, m) for path, m in root.named_modules() if is_chain(m, transform)]
    for path, seq in reversed(chains):  # reversed pre-order: every chain before its parents
        steps = edit(path, seq.named_steps())
        if steps is None:
            continue
        new = Sequential(OrderedDict(steps))
        new.training = seq.training
        root = replace_everywhere(root, where.get(id(seq), [path]), new)
    return root


# ---------------------------------------------------------------- what may stand in a run
def _role(module: Module) -> tuple[str, str]:
    """``('linear' | 'lazy' | 'pass' | 'stop', why)``: how ``module`` counts in a run."""
    if is_lazy(module):  # a materialized one *is* a Linear
        return "lazy", ("is not materialized (its in_features is unknown): run the model on "
                        "an input once, or load its weights, first")
    rule = rule_for(module)
    kind = rule.kind if rule is not None else None
    if kind == "linear" and lists(module, NAME):  # a plain Linear (its own rule lists it)
        return "linear", ""
    if kind in ("identity", "dropout") and lists(module, NAME):
        if kind == "dropout" and module.training and module.p:
            return "stop", "drops at random in training mode: call eval() first"
        return "pass", ""
    if kind == "linear":
        if own_rule(module) is rule:
            return "stop", f"is a {type(module).__name__} whose layer rule does not list {NAME}"
        return "stop", (f"is a {type(module).__name__}, not a plain Linear: its forward may "
                        "compute something else")
    why = {
        "activation": "is nonlinear",
        "flatten": "reshapes its input (a Linear maps the last dimension only)",
        "layernorm": "normalizes each row (nonlinear; fold_norm folds its affine part)",
        "batchnorm": ("is a normalization: fold_norm folds an eval-mode BatchNorm1d into the "
                      "Linear before it; then merge"),
        "sequential": "is a container: its own steps are merged within it, not across it",
        "residual": "adds its input back (a skip connection): not a step of one chain",
    }.get(kind)
    if why is None:
        why = ("has no layer rule: linearkit cannot tell that it is linear" if rule is None
               else f"is not a pass-through layer (its rule's kind is {kind!r})")
    return "stop", why


@dataclass
class _Unit:
    """A Linear of a run, or several already merged: its sizes and cost."""

    paths: list
    n_in: int
    n_out: int
    bias: bool
    params: int
    flops: int  # per input row: 2·in·out + out for the bias


def _unit(path: str, layer: Linear) -> _Unit:
    bias = layer.bias is not None
    n_in, n_out = layer.in_features, layer.out_features
    return _Unit([path], n_in, n_out, bias, n_in * n_out + n_out * bias,
                 2 * n_in * n_out + n_out * bias)


def _merged(units: list) -> _Unit:
    """The unit merging ``units`` would make."""
    n_in, n_out = units[0].n_in, units[-1].n_out
    bias = any(u.bias for u in units)
    return _Unit([p for u in units for p in u.paths], n_in, n_out, bias,
                 n_in * n_out + n_out * bias, 2 * n_in * n_out + n_out * bias)


def _saves(units: list) -> bool:
    m = _merged(units)
    return m.params < sum(u.params for u in units) or m.flops < sum(u.flops for u in units)


def _plan(units: list, force: bool) -> list:
    """Split a run into groups to merge (``[[unit, ...], ...]``, singletons left alone).

    The whole run when forced or when merging it saves; otherwise greedily from the left: the
    longest sub-run starting at each layer that saves, else that layer alone. (Greedy, not
    optimal: documented in merge_linear.)
    """
    if force or _saves(units):
        return [units]
    groups, i = [], 0
    while i < len(units):
        for j in range(len(units), i + 1, -1):
            if _saves(units[i:j]):
                groups.append(units[i:j])
                i = j
                break
        else:
            groups.append([units[i]])
            i += 1
    return groups


def _plus(paths) -> str:
    return "+".join(f"'{p}'" for p in paths)


def _costs_text(units: list) -> str:
    m = _merged(units)
    before_p, before_f = sum(u.params for u in units), sum(u.flops for u in units)
    inner = min(u.n_out for u in units[:-1])
    head = (f"a rank-{inner} bottleneck: " if inner < min(m.n_in, m.n_out) else "")
    return (f"{head}merging would take params {before_p:,} -> {m.params:,} (FLOPs per row "
            f"{before_f:,} -> {m.flops:,}); pass force=True to merge anyway")


# ---------------------------------------------------------------- one chain
class _Chain:
    """The runs of one Sequential: where they are, what separates them."""

    def __init__(self, prefix: str, steps: list):
        self.prefix, self.steps = prefix, steps
        self.paths = [join(prefix, name) for name, _ in steps]
        self.roles = [_role(m) for _, m in steps]

    def text(self, i: int) -> str:
        return named(self.paths[i], self.steps[i][1])

    def gap(self, i: int, j: int) -> str | None:
        """Why the linear layers at steps ``i < j`` cannot be one map, or None."""
        for k in range(i + 1, j):
            role, why = self.roles[k]
            if role not in ("pass", "linear"):
                return f"{self.text(k)} {why}"
        for k in (i, j):
            role, why = self.roles[k]
            if role != "linear":
                return f"{self.text(k)} {why}"
        dtypes = {self.steps[k][1].weight.dtype for k in range(i, j + 1)
                  if self.roles[k][0] == "linear"}
        if len(dtypes) > 1:
            names = ", ".join(f"'{self.paths[k]}' {self.steps[k][1].weight.dtype}"
                              for k in range(i, j + 1) if self.roles[k][0] == "linear")
            return f"mixed dtypes ({names}): one merged layer would compute in one dtype"
        return None

    def runs(self, left: list) -> list:
        """Maximal runs ``[step index, ...]`` (2+ Linears); a line in ``left`` for each pair of
        neighbouring linear layers something keeps apart."""
        linear = [k for k, (role, _) in enumerate(self.roles) if role in ("linear", "lazy")]
        runs, current = [], []
        for a, b in itertools.pairwise(linear):
            why = self.gap(a, b)
            if why is None:
                current = current or [a]
                current.append(b)
                continue
            left.append(f"{_plus([self.paths[a], self.paths[b]])} not merged: {why}")
            if len(current) > 1:
                runs.append(current)
            current = []
        if len(current) > 1:
            runs.append(current)
        return runs


def _merge_group(chain: _Chain, group: list, index: dict) -> tuple[Linear, dict, str]:
    """The merged Linear of ``group`` (units of one run), its report dict and changed line."""
    layers = [chain.steps[index[p]][1] for u in group for p in u.paths]
    w = as_float64(layers[0].weight.data)
    b = None if layers[0].bias is None else as_float64(layers[0].bias.data)
    for layer in layers[1:]:
        w, b = merge_weights(w, b, layer.weight.data,
                             None if layer.bias is None else layer.bias.data)
    new = linear_from(w, b, layers[0].weight.dtype)
    # Frozen only when every merged weight (bias) was frozen.
    new.weight.requires_grad = any(m.weight.requires_grad for m in layers)
    if new.bias is not None:
        new.bias.requires_grad = any(m.bias.requires_grad for m in layers if m.bias is not None)
    new.training = layers[0].training
    merged, paths = _merged(group), [p for u in group for p in u.paths]
    first, last = index[paths[0]], index[paths[-1]]
    removed = [chain.paths[k] for k in range(first + 1, last + 1) if chain.paths[k] not in paths]
    params = sum(u.params for u in group)
    flops = sum(u.flops for u in group)
    texts = " . ".join(rule_for(m).describe_module(m) for m in layers)
    line = (f"{_plus(paths)}: {texts} -> {rule_for(new).describe_module(new)} (params "
            f"{params:,} -> {merged.params:,}, FLOPs per row {flops:,} -> {merged.flops:,})")
    info = {"path": paths[0], "merged": paths, "removed": removed, "params_before": params,
            "params_after": merged.params, "flops_before": flops, "flops_after": merged.flops}
    return new, info, line


def _tied_outside(chain: _Chain, group: list, index: dict, ties: Ties) -> str | None:
    """Why ``group`` may not merge because one of its Linears is tied to a use outside it (the
    merged layer would replace it here only: its other uses would keep the old layer, untied),
    or None. A layer whose every use is inside the group (``Sequential(a, a)``) merges."""
    steps = [chain.steps[index[p]][1] for u in group for p in u.paths]
    count: dict[int, int] = {}
    for m in steps:
        count[id(m)] = count.get(id(m), 0) + 1
    for u in group:
        for p in u.paths:
            m = chain.steps[index[p]][1]
            if ties.slots(m) > count[id(m)]:
                return (f"{ties.tied_text(p, m)}: merging it here would replace it at this use "
                        "only and untie it from the others; to merge, give this use its own "
                        "copy first (copy.deepcopy of the layer at that path)")
    return None


def _edit(chain: _Chain, runs: list, force: bool, exact: bool, changed: list, left: list,
          layers: list, ties: Ties):
    """The chain's new steps after merging ``runs``, or None when nothing merged. ``exact``:
    merge each run whole or not at all (``only=``), never a part of it. A group holding a
    Linear also used outside it (``ties``) is left, with why."""
    index = {p: k for k, p in enumerate(chain.paths)}
    replace, drop = {}, set()
    for run in runs:
        units = [_unit(chain.paths[k], chain.steps[k][1]) for k in run]
        if exact and not (force or _saves(units)):
            left.append(f"{_plus(_merged(units).paths)} not merged: {_costs_text(units)}")
            continue
        groups = _plan(units, force)
        for a, b in itertools.pairwise(groups):
            a, b = _merged(a), _merged(b)
            left.append(f"{_plus(a.paths)} . {_plus(b.paths)} not merged: "
                        + _costs_text([a, b]))
        for group in groups:
            if len(group) < 2:
                continue
            why = _tied_outside(chain, group, index, ties)
            if why is not None:
                left.append(f"{_plus(_merged(group).paths)} not merged: {why}")
                continue
            new, info, line = _merge_group(chain, group, index)
            first, last = index[info["path"]], index[info["merged"][-1]]
            replace[first] = new
            drop.update(range(first + 1, last + 1))
            changed.append(line)
            layers.append(info)
    if not replace:
        return None
    return [(name, replace.get(k, m)) for k, (name, m) in enumerate(chain.steps)
            if k not in drop]


# ---------------------------------------------------------------- only=
def _named_runs(model: Module, only) -> dict:
    """``{chain path: [[step index, ...], ...]}`` for ``only=[(first, last), ...]``; a
    ValueError naming the layer and why for a run that is not one linear map."""
    modules = dict(model.named_modules())
    chains = {p: _Chain(p, m.named_steps()) for p, m in modules.items() if is_chain(m, NAME)}
    pairs = [only] if (isinstance(only, tuple) and len(only) == 2
                       and all(isinstance(p, str) for p in only)) else list(only)
    wanted, taken = {}, {}
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(p, str) for p in pair)):
            raise TypeError(f"{NAME}(only=...) takes (first_path, last_path) pairs of strings, "
                            f"got {pair!r}")
        first, last = pair
        for p in (first, last):
            if p not in modules:
                there = ", ".join(repr(q) for q, m in modules.items()
                                  if _role(m)[0] == "linear")
                raise ValueError(f"{NAME}(only=...): no layer at path {p!r}; the model's Linear "
                                 f"layers are: {there or 'none'}")
        parent, parent_last = first.rpartition(".")[0], last.rpartition(".")[0]
        chain = chains.get(parent)
        if chain is None or parent != parent_last or first == last:
            raise ValueError(f"{NAME}(only=...): {first!r} and {last!r} are not two steps of one "
                             "Sequential: a run is the (first, last) Linear of one chain")
        index = {p: k for k, p in enumerate(chain.paths)}
        i, j = index[first], index[last]
        if i > j:
            raise ValueError(f"{NAME}(only=...): {first!r} comes after {last!r} in the chain; "
                             f"name the run in call order: ({last!r}, {first!r})")
        for k in (i, j):
            role, why = chain.roles[k]
            if role != "linear":
                raise ValueError(f"{NAME}(only=...): cannot merge {first!r}..{last!r}: "
                                 f"{chain.text(k)} " + ("is not a Linear: a run starts and ends "
                                                        "at a Linear" if role != "lazy" else why))
        why = chain.gap(i, j)
        if why is not None:
            raise ValueError(f"{NAME}(only=...): cannot merge {first!r}..{last!r}: {why}, so "
                             "the layers around it are not one linear map")
        for k in range(i, j + 1):
            if (parent, k) in taken:
                raise ValueError(f"{NAME}(only=...): the runs {taken[(parent, k)]} and "
                                 f"{(first, last)} overlap at {chain.paths[k]!r}")
            taken[(parent, k)] = (first, last)
        run = [k for k in range(i, j + 1) if chain.roles[k][0] == "linear"]
        wanted.setdefault(parent, []).append(run)
    return wanted


# ---------------------------------------------------------------- the module tier
def merge_linear(model: Module, *, force: bool = False, only=None, probe=None):
    """Merge every run of consecutive Linear layers with nothing nonlinear between into one.

    In every ``Sequential`` (nested ones too; a child Sequential's steps form their own chain),
    a run is two or more ``Linear`` layers with only pass-through layers between them:
    ``Identity``, and ``Dropout`` in eval mode or with ``p == 0`` (layers whose rule's kind is
    'identity' or 'dropout' and lists ``merge_linear``). Anything else — an activation, a norm,
    Flatten, a Dropout in training mode, a container, a layer without a rule — ends the run;
    where it stands between two Linears, ``report.left`` names it and says why. So do an
    unmaterialized ``LazyLinear`` and a change of dtype within a run.

    A run is merged (``merge_weights``: ``W = Wk … W2 W1``) only when that saves parameters or
    FLOPs: ``Linear(d, r)`` then ``Linear(r, d)`` with a small ``r`` is cheaper than the
    ``Linear(d, d)`` it would make, and is left, with both counts in ``report.left`` — unless
    ``force=True``. When a run of three or more does not save as a whole, its sub-runs are
    merged greedily from the left (the longest that saves, starting at each layer); this is not
    guaranteed to be the cheapest split.

    A Linear used at several places (tied: one object at several paths) merges only in a group
    that holds all of its uses (``Sequential(a, a)``); otherwise its group is left, with why in
    ``report.left`` — merging one use would untie it. A chain used at several paths is merged
    once and the one new chain put at each of them, so the tie stays.

    The merged Linear takes the first layer's name, dtype and training flag; the run's other
    layers and the pass-through layers between them are removed (a Dropout removed this way
    no longer drops after ``train()``: merging is for inference). Every other child keeps its
    name. Its weight (bias) is frozen only when every merged weight (bias) was.

    Parameters
    ----------
    model : Module
        Not modified: the transform edits a copy.
    force : bool
        Merge every run whole, even where that costs parameters.
    only : list of ``(first_path, last_path)``, optional
        Merge exactly these runs (the first and last Linear of each, steps of one Sequential)
        and nothing else; still only where that saves, unless ``force``. A named run with
        something between that is not linear (or an end that is not a Linear) is a ValueError
        naming that layer and why.
    probe : array ``(N, *in)``, optional
        A batch of real inputs to check the merged model on, besides random ones.

    Returns
    -------
    new_model : Module
    report : TransformReport
        ``changed``: ``"'0'+'2': Linear(3, 4) . Linear(4, 2) -> Linear(3, 2) (params 26 -> 8,
        FLOPs per row 46 -> 14)"``; ``left``: what was not merged and why; ``layers``: per
        merge ``{path, merged, removed, params_before, params_after, flops_before,
        flops_after}`` (FLOPs per input row: ``2·in·out``, plus ``out`` for a bias).

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import merge_linear
    >>> model = lk.Sequential(lk.Linear(3, 4), lk.Identity(), lk.Linear(4, 2), lk.ReLU(),
    ...                       lk.Linear(2, 2))
    >>> new, report = merge_linear(model)
    >>> new
    Sequential(
      (0): Linear(in_features=3, out_features=2, bias=True)
      (3): ReLU()
      (4): Linear(in_features=2, out_features=2, bias=True)
    )
    >>> report.changed
    ["'0'+'2': Linear(3, 4) . Linear(4, 2) -> Linear(3, 2) (params 26 -> 8, FLOPs per row 46 -> 14)"]
    >>> report.left
    ["'2'+'4' not merged: '3' (ReLU) is nonlinear"]
    >>> report.max_abs_error < 1e-6
    True
    """
    new = copy_model(model, NAME)
    changed, left, layers = [], [], []
    wanted = None if only is None else _named_runs(new, only)
    ties = Ties(new)

    def edit(prefix, steps):
        chain = _Chain(prefix, steps)
        if wanted is None:
            runs = chain.runs(left)
        else:
            runs = wanted.get(prefix, [])
        if not runs:
            return None
        return _edit(chain, runs, force, wanted is not None, changed, left, layers, ties)

    new = edit_chains(new, edit)
    return new, finish(NAME, model, new, probe, changed, left, layers)
