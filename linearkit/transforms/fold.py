"""``fold_norm``: normalizations folded into the Linear layers next to them, for inference.

* ``Linear`` then eval-mode ``BatchNorm1d``: the BatchNorm is a fixed per-channel scale and
  shift, ``(z - mean) / sqrt(var + eps) * gamma + beta``, so it folds into the Linear's weight
  and bias (PyTorch's ``torch.nn.utils.fusion.fuse_linear_bn_weights`` arithmetic) and goes.
  In training mode it normalizes with each batch's own statistics: no fixed map exists.
* A bias before a BatchNorm is cancelled exactly (the BatchNorm subtracts each channel's mean,
  bias included): ``keep_batchnorm=True`` removes just that bias, in either mode.
* ``LayerNorm`` then ``Linear``: the LayerNorm's affine ``gamma, beta`` folds into the Linear
  after it; the LayerNorm stays, without affine.
* ``RMSNorm`` then ``Linear``: the same for the RMSNorm's ``weight`` (it has no bias); the
  RMSNorm stays, with ``elementwise_affine=False``. A Linear's bias before an RMSNorm is never
  cancelled (an RMSNorm subtracts no mean), so nothing folds there.
* ``Linear`` (with a bias) then ``LayerNorm``: the LayerNorm subtracts each row's mean across
  features, which removes only the bias's *mean* — not the whole bias (a common claim is that
  the LayerNorm cancels it; it does not). The rest,
  ``b - mean(b)``, shifts features unequally: it changes the centred values and the standard
  deviation the LayerNorm divides by, so it is kept.
"""

from __future__ import annotations

import numpy as np

from ..core.module import Module
from ..layers import BatchNorm1d, LayerNorm, Linear, RMSNorm
from ..rules import rule_for
from .merge import as_float64, bias_through, edit_chains, join
from .walk import Ties, copy_model, finish, linear_from, lists, named

__all__ = ["fold_batchnorm_weights", "fold_layernorm_weights", "fold_norm"]

NAME = "fold_norm"




def _out_dtype(w: np.ndarray) -> np.dtype:
    return w.dtype if np.issubdtype(w.dtype, np.floating) else np.dtype(np.float64)


def _check_vector(name: str, v, n: int, what: str) -> None:
    if v is not None and np.shape(v) != (n,):
        raise ValueError(f"{name} has shape {np.shape(v)}, but {what} is {n}: {name} must be "
                         f"({n},)" + ("" if name in ("bn_running_mean", "bn_running_var")
                                      else " or None"))


# ---------------------------------------------------------------- the array tier
def fold_batchnorm_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """A Linear followed by an eval-mode BatchNorm1d as one Linear: ``(w, b)``.

    The arithmetic (and argument order) of PyTorch's
    ``torch.nn.utils.fusion.fuse_linear_bn_weights``::

        scale = bn_w / sqrt(bn_rv + bn_eps)
        w = linear_w * scale[:, None]
        b = (linear_b - bn_rm) * scale + bn_b

    Parameters
    ----------
    linear_w : array ``(out, in)``
    linear_b : array ``(out,)`` or None (zeros)
    bn_rm, bn_rv : array ``(out,)``
        The BatchNorm's running mean and (biased-normalizing) running variance.
    bn_eps : float
    bn_w : array ``(out,)`` or None (ones: ``affine=False``)
    bn_b : array ``(out,)`` or None (zeros)

    Returns
    -------
    w : ndarray ``(out, in)``
    b : ndarray ``(out,)`` — always a bias, even when ``linear_b`` is None.
        Computed in float64, returned in ``linear_w``'s dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms import fold_batchnorm_weights
    >>> w, b = fold_batchnorm_weights(np.array([[1., 2.], [3., 4.]]), None,
    ...                               np.array([1., -1.]), np.array([4., 1.]), 0.0,
    ...                               np.array([2., 1.]), np.array([0., 5.]))
    >>> w      # row 0 scaled by 2 / sqrt(4) = 1, row 1 by 1 / sqrt(1) = 1
    array([[1., 2.],
           [3., 4.]])
    >>> b      # (0 - 1) * 1 + 0, (0 + 1) * 1 + 5
    array([-1.,  6.])
    """
    linear_w = np.asarray(linear_w)
    if linear_w.ndim != 2:
        raise ValueError(f"linear_w must be 2-D (out, in), got shape {linear_w.shape}")
    n = linear_w.shape[0]
    what = "the Linear's out_features"
    for name, v in (("linear_b", linear_b), ("bn_running_mean", bn_rm),
                    ("bn_running_var", bn_rv), ("bn_w", bn_w), ("bn_b", bn_b)):
        if v is None and name.startswith("bn_running"):
            raise ValueError(f"{name} is None: a BatchNorm without running statistics "
                             "normalizes with each batch's own and has no fixed affine map")
        _check_vector(name, v, n, what)
    scale = (np.ones(n) if bn_w is None else as_float64(bn_w)) / np.sqrt(as_float64(bn_rv) + bn_eps)
    w = as_float64(linear_w) * scale[:, None]
    b = ((0.0 if linear_b is None else as_float64(linear_b)) - as_float64(bn_rm)) * scale
    if bn_b is not None:
        b = b + as_float64(bn_b)
    dtype = _out_dtype(linear_w)
    return w.astype(dtype), b.astype(dtype)


def fold_layernorm_weights(ln_w, ln_b, linear_w, linear_b):
    """A LayerNorm's affine folded into the Linear after it: ``(w, b)``.

    ``Linear(gamma * xhat + beta) = xhat (W * gamma[None, :])ᵀ + (W beta + b)``, so::

        w = linear_w * ln_w[None, :]
        b = linear_w @ ln_b + linear_b

    and the LayerNorm keeps only its normalization (``elementwise_affine=False``).

    Parameters
    ----------
    ln_w : array ``(in,)`` or None (ones)
        The LayerNorm's weight ``gamma`` over the last dimension.
    ln_b : array ``(in,)`` or None (zeros)
        Its bias ``beta``.
    linear_w : array ``(out, in)``
    linear_b : array ``(out,)`` or None (zeros)

    Returns
    -------
    w : ndarray ``(out, in)``
    b : ndarray ``(out,)``, or None when both ``ln_b`` and ``linear_b`` are None.
        Computed in float64, returned in ``linear_w``'s dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from linearkit.transforms import fold_layernorm_weights
    >>> w, b = fold_layernorm_weights(np.array([2., 3.]), np.array([1., -1.]),
    ...                               np.array([[1., 1.], [0., 1.]]), np.array([0., 10.]))
    >>> w      # columns scaled by gamma
    array([[2., 3.],
           [0., 3.]])
    >>> b      # W @ beta + b
    array([0., 9.])
    """
    linear_w = np.asarray(linear_w)
    if linear_w.ndim != 2:
        raise ValueError(f"linear_w must be 2-D (out, in), got shape {linear_w.shape}")
    n_out, n_in = linear_w.shape
    _check_vector("ln_w", ln_w, n_in, "the Linear's in_features")
    _check_vector("ln_b", ln_b, n_in, "the Linear's in_features")
    _check_vector("linear_b", linear_b, n_out, "the Linear's out_features")
    w64 = as_float64(linear_w)
    w = w64 if ln_w is None else w64 * as_float64(ln_w)[None, :]
    dtype = _out_dtype(linear_w)
    b = bias_through(w64, ln_b, linear_b)  # the LayerNorm's beta through W, plus the bias
    return w.astype(dtype), None if b is None else b.astype(dtype)


# ---------------------------------------------------------------- the module tier
def _is(module: Module, kind: str) -> bool:
    """The module's rule has ``kind`` ('linear', 'batchnorm', 'layernorm') and its own rule
    lists fold_norm (``walk.lists``: a subclass may compute something else)."""
    rule = rule_for(module)
    return rule is not None and rule.kind == kind and lists(module, NAME)


def _text(module: Module) -> str:
    return rule_for(module).describe_module(module)


def _size(*modules: Module) -> int:
    return sum(np.asarray(v).size for m in modules for k, v in m.state_dict().items()
               if k != "num_batches_tracked")


def _rebuilt(old: Linear, w, b) -> Linear:
    """A Linear holding ``w, b`` with ``old``'s dtype, training flag and frozen flags."""
    new = linear_from(w, b, old.weight.dtype)
    new.weight.requires_grad = old.weight.requires_grad
    if new.bias is not None:
        new.bias.requires_grad = (old.bias.requires_grad if old.bias is not None
                                  else old.weight.requires_grad)
    new.training = old.training
    return new


class _Folder:
    """The edits of one fold_norm call: each handler looks at one pair of neighbouring steps."""

    def __init__(self, root: Module, keep_batchnorm: bool):
        self.root_training = root.training
        self.keep_batchnorm = keep_batchnorm
        self.ties = Ties(root)
        self.changed, self.left, self.layers = [], [], []

    def tied(self, edited: list) -> str | None:
        """Why the pair may not fold because a module the fold would replace or edit is tied
        (used at other places too, which the fold here would not see), or None. ``edited``:
        ``[(path, module), ...]`` of the modules the fold changes."""
        for path, m in edited:
            if self.ties.slots(m) > 1:
                return (f"{self.ties.tied_text(path, m)}: a fold here is for this use alone, "
                        "so it would either change the layer's other uses too or untie it from "
                        "them; to fold, give this use its own copy first (copy.deepcopy of the "
                        "layer at that path)")
        return None

    # -- Linear then BatchNorm1d
    def linear_bn(self, pa: str, lin: Linear, pb: str, bn: BatchNorm1d):
        """-> the new Linear and whether the BatchNorm goes; None when left as it is."""
        pair = f"{named(pa, lin)} . {named(pb, bn)}"
        if bn.num_features != lin.out_features:
            self.left.append(f"{pair}: not folded: the BatchNorm's {bn.num_features} channels "
                             f"are not the Linear's {lin.out_features} outputs")
            return None
        if bn.dtype != lin.weight.dtype:
            self.left.append(f"{pair}: not folded: mixed dtypes ({lin.weight.dtype} and "
                             f"{bn.dtype})")
            return None
        if self.keep_batchnorm:
            return self.drop_bias_before_bn(pa, lin, pb, bn, pair)
        if bn.running_mean is None or bn.running_var is None:
            self.left.append(f"{pair}: not folded: the BatchNorm has no running statistics "
                             "(track_running_stats=False), so it always normalizes with each "
                             "batch's own and no fixed affine map exists")
            return None
        if bn.training or self.root_training:
            who = "is" if bn.training else "belongs to a model that is"
            raise ValueError(
                f"{NAME}(): cannot fold {named(pb, bn)} into {named(pa, lin)}: the BatchNorm "
                f"{who} in training mode, where it normalizes with each batch's statistics, so "
                "no fixed affine map exists to fold; call model.eval() first (or pass "
                "keep_batchnorm=True to remove only the Linear's bias, which it cancels)")
        w, b = fold_batchnorm_weights(
            lin.weight.data, None if lin.bias is None else lin.bias.data, bn.running_mean,
            bn.running_var, bn.eps, None if bn.weight is None else bn.weight.data,
            None if bn.bias is None else bn.bias.data)
        new = _rebuilt(lin, w, b)
        before, after = _size(lin, bn), _size(new)
        added = " (a bias added)" if lin.bias is None else ""
        self.changed.append(f"{_plus(pa, pb)}: {_text(lin)} . {_text(bn)} -> {_text(new)}: the "
                            f"BatchNorm's running statistics and affine folded into the weight "
                            f"and bias{added}, the BatchNorm removed (params {before:,} -> "
                            f"{after:,})")
        self.layers.append({"path": pa, "folded": pb, "kind": "batchnorm",
                            "bias_added": lin.bias is None, "params_before": before,
                            "params_after": after})
        return new, True

    def drop_bias_before_bn(self, pa, lin, pb, bn, pair):
        if lin.bias is None:
            return None
        b = lin.bias.data
        if bn.running_mean is not None:
            # BN(z + b) with running mean m equals BN(z) with running mean m - b, in eval; in
            # training the batch mean moves by b too, and the running update keeps the shift.
            bn.running_mean[...] = (as_float64(bn.running_mean) - as_float64(b)).astype(bn.dtype)
        new = _rebuilt(lin, lin.weight.data, None)
        shifted = " and shifted into its running_mean" if bn.running_mean is not None else ""
        self.changed.append(
            f"{named(pa, lin)}: bias removed{shifted}: {named(pb, bn)} subtracts each channel's "
            f"mean, the bias included, so it cancels the bias exactly in training and in eval "
            f"(params {lin.out_features:,} fewer)")
        self.layers.append({"path": pa, "folded": pb, "kind": "batchnorm_bias",
                            "bias_removed": float(np.abs(as_float64(b)).max()) if b.size else 0.0,
                            "params_before": _size(lin), "params_after": _size(new)})
        return new, False

    # -- LayerNorm then Linear
    def ln_linear(self, pa: str, ln: LayerNorm, pb: str, lin: Linear):
        """-> (the new LayerNorm, the new Linear), or None."""
        if ln.weight is None and ln.bias is None:
            return None
        pair = f"{named(pa, ln)} . {named(pb, lin)}"
        if ln.normalized_shape != (lin.in_features,):
            self.left.append(f"{pair}: affine not folded: the LayerNorm's weight spans "
                             f"{ln.normalized_shape}, not just the Linear's {lin.in_features} "
                             "input features")
            return None
        if ln.dtype != lin.weight.dtype:
            self.left.append(f"{pair}: affine not folded: mixed dtypes ({ln.dtype} and "
                             f"{lin.weight.dtype})")
            return None
        w, b = fold_layernorm_weights(None if ln.weight is None else ln.weight.data,
                                      None if ln.bias is None else ln.bias.data,
                                      lin.weight.data, None if lin.bias is None else lin.bias.data)
        new_ln = LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=False,
                           dtype=ln.dtype)
        new_ln.training = ln.training
        new_lin = _rebuilt(lin, w, b)
        before, after = _size(ln, lin), _size(new_ln, new_lin)
        self.changed.append(f"{_plus(pa, pb)}: the LayerNorm's affine (weight, bias) folded into "
                            f"the Linear: {_text(ln)} . {_text(lin)} -> LayerNorm("
                            f"{ln.normalized_shape}, elementwise_affine=False) . "
                            f"{_text(new_lin)} (params {before:,} -> {after:,})")
        self.layers.append({"path": pb, "folded": pa, "kind": "layernorm_affine",
                            "params_before": before, "params_after": after})
        return new_ln, new_lin

    # -- RMSNorm then Linear
    def rms_linear(self, pa: str, rn: RMSNorm, pb: str, lin: Linear):
        """-> (the new RMSNorm, the new Linear), or None."""
        if rn.weight is None:
            return None
        pair = f"{named(pa, rn)} . {named(pb, lin)}"
        if rn.normalized_shape != (lin.in_features,):
            self.left.append(f"{pair}: weight not folded: the RMSNorm's weight spans "
                             f"{rn.normalized_shape}, not just the Linear's {lin.in_features} "
                             "input features")
            return None
        if rn.dtype != lin.weight.dtype:
            self.left.append(f"{pair}: weight not folded: mixed dtypes ({rn.dtype} and "
                             f"{lin.weight.dtype})")
            return None
        w, b = fold_layernorm_weights(rn.weight.data, None, lin.weight.data,
                                      None if lin.bias is None else lin.bias.data)
        new_rn = RMSNorm(rn.normalized_shape, eps=rn.eps, elementwise_affine=False,
                         dtype=rn.dtype)
        new_rn.training = rn.training
        new_lin = _rebuilt(lin, w, b)
        before, after = _size(rn, lin), _size(new_rn, new_lin)
        self.changed.append(f"{_plus(pa, pb)}: the RMSNorm's weight folded into the Linear: "
                            f"{_text(rn)} . {_text(lin)} -> RMSNorm({rn.normalized_shape}, "
                            f"elementwise_affine=False) . {_text(new_lin)} (params {before:,} "
                            f"-> {after:,})")
        self.layers.append({"path": pb, "folded": pa, "kind": "rmsnorm_weight",
                            "params_before": before, "params_after": after})
        return new_rn, new_lin

    # -- Linear then LayerNorm
    def linear_ln(self, pa: str, lin: Linear, pb: str, ln: LayerNorm):
        """-> the new Linear (its bias less its mean), or None."""
        if lin.bias is None:
            return None
        pair = f"{named(pa, lin)} . {named(pb, ln)}"
        if ln.normalized_shape != (lin.out_features,):
            self.left.append(f"{pair}: bias kept: the LayerNorm normalizes over "
                             f"{ln.normalized_shape}, not the Linear's {lin.out_features} "
                             "outputs")
            return None
        b = as_float64(lin.bias.data)
        mean = float(b.mean()) if b.size else 0.0
        if mean == 0.0:
            return None
        rest = b - mean
        new = _rebuilt(lin, lin.weight.data, rest)
        self.changed.append(f"{named(pa, lin)}: the bias's mean across features ({mean:.6g}) "
                            f"removed: {named(pb, ln)} subtracts each row's mean, which cancels "
                            "exactly that part")
        self.left.append(f"{named(pa, lin)}: the rest of the bias (b - mean(b), max |.| "
                         f"{float(np.abs(rest).max()):.6g}) kept: it shifts the features "
                         "unequally, changing the centred values and the standard deviation "
                         "the LayerNorm divides by, so the LayerNorm does not cancel it")
        self.layers.append({"path": pa, "folded": pb, "kind": "layernorm_bias_mean",
                            "mean_removed": mean, "rest_max_abs": float(np.abs(rest).max()),
                            "params_before": _size(lin), "params_after": _size(new)})
        return new

    # -- one chain
    def edit(self, prefix: str, steps: list):
        steps = [list(s) for s in steps]
        touched = False
        i = 0
        while i < len(steps) - 1:
            (na, a), (nb, b) = steps[i], steps[i + 1]
            pa, pb = join(prefix, na), join(prefix, nb)
            # The modules each fold replaces: the Linear (and, keeping the BatchNorm, the
            # BatchNorm whose running_mean it shifts; a folded-away BatchNorm is only read).
            norm_then_linear = _is(b, "linear") and (_is(a, "layernorm") or _is(a, "rmsnorm"))
            edited = ([(pa, a), (pb, b)] if norm_then_linear else
                      [(pa, a), (pb, b)] if self.keep_batchnorm and _is(b, "batchnorm") else
                      [(pa, a)])
            foldable = ((_is(a, "linear") and _is(b, "batchnorm")) or norm_then_linear
                        or (_is(a, "linear") and _is(b, "layernorm")))
            why = self.tied(edited) if foldable else None
            if why is not None:
                self.left.append(f"{named(pa, a)} . {named(pb, b)}: not folded: {why}")
            elif _is(a, "linear") and _is(b, "batchnorm"):
                done = self.linear_bn(pa, a, pb, b)
                if done is not None:
                    touched = True
                    steps[i][1], remove = done
                    if remove:
                        del steps[i + 1]
                        continue  # the Linear's new neighbour may fold too
            elif _is(a, "layernorm") and _is(b, "linear"):
                done = self.ln_linear(pa, a, pb, b)
                if done is not None:
                    touched = True
                    steps[i][1], steps[i + 1][1] = done
            elif _is(a, "rmsnorm") and _is(b, "linear"):
                done = self.rms_linear(pa, a, pb, b)
                if done is not None:
                    touched = True
                    steps[i][1], steps[i + 1][1] = done
            elif _is(a, "linear") and _is(b, "layernorm"):
                done = self.linear_ln(pa, a, pb, b)
                if done is not None:
                    touched = True
                    steps[i][1] = done
            i += 1
        return [tuple(s) for s in steps] if touched else None


def _plus(*paths) -> str:
    return "+".join(f"'{p}'" for p in paths)


def fold_norm(model: Module, *, probe=None, keep_batchnorm: bool = False):
    """Fold the normalizations of ``model``'s Sequential chains into their Linear layers.

    Pairs of directly consecutive steps of a ``Sequential`` (nested ones too), left to right:

    * ``Linear`` then ``BatchNorm1d`` (eval mode, running statistics): the BatchNorm folds into
      the Linear (``fold_batchnorm_weights``; a bias appears if the Linear had none) and is
      removed. A BatchNorm to fold in training mode, or in a model in training mode, is
      refused (ValueError naming it; call ``model.eval()`` first). One without running
      statistics (``track_running_stats=False``) is left: it always uses batch statistics.
    * ``keep_batchnorm=True``: instead of folding, the Linear's bias — which the BatchNorm
      cancels exactly — is removed and subtracted from ``running_mean``, so the outputs are
      unchanged in eval mode, and in training mode on any batch (works in either mode).
    * ``LayerNorm`` then ``Linear``: the LayerNorm's affine folds into the Linear
      (``fold_layernorm_weights``); the LayerNorm stays, with ``elementwise_affine=False``.
    * ``RMSNorm`` then ``Linear``: the RMSNorm's weight folds into the Linear's columns (the
      Linear's bias is unchanged); the RMSNorm stays, with ``elementwise_affine=False``.
    * ``Linear`` with a bias then ``LayerNorm`` over its ``out_features``: the bias's mean
      across features is removed (the LayerNorm cancels that part); the rest is kept, and
      ``report.left`` says why.

    A module the fold would replace or edit that is used at other places too (tied: one
    object at several paths) is left, with why in ``report.left``: the fold is for one use.
    A chain used at several paths is folded once and the one new chain put at each of them.

    The folds assume the Linear's output is ``(N, out_features)`` (or ``(out_features,)``): on a
    3-D input a BatchNorm1d normalizes dim 1, not the Linear's output features. Layers whose
    rule does not list ``fold_norm`` (and subclasses of these layers) are not touched.

    Parameters
    ----------
    model : Module
        Not modified: the transform edits a copy.
    probe : array ``(N, *in)``, optional
        A batch of real inputs to check the result on, besides random ones.
    keep_batchnorm : bool
        Keep every BatchNorm; remove only the biases they cancel.

    Returns
    -------
    new_model : Module
    report : TransformReport
        ``changed``/``left``: a line per edit (and per pair left, with why); ``layers``: a dict
        per edit ``{path, folded, kind, params_before, params_after, ...}`` with ``kind`` one of
        'batchnorm', 'batchnorm_bias', 'layernorm_affine', 'rmsnorm_weight',
        'layernorm_bias_mean'.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.transforms import fold_norm
    >>> model = lk.Sequential(lk.Linear(3, 4), lk.BatchNorm1d(4), lk.ReLU()).eval()
    >>> new, report = fold_norm(model)
    >>> new
    Sequential(
      (0): Linear(in_features=3, out_features=4, bias=True)
      (2): ReLU()
    )
    >>> report.params_before, report.params_after, report.max_abs_error < 1e-6
    (32, 16, True)
    """
    new = copy_model(model, NAME)
    folder = _Folder(new, keep_batchnorm)
    new = edit_chains(new, folder.edit, NAME)
    return new, finish(NAME, model, new, probe, folder.changed, folder.left, folder.layers)
