"""Import fitted scikit-learn estimators as linearkit models: ``from_sklearn(estimator)``.

Supported: ``MLPClassifier``, ``MLPRegressor``, ``LogisticRegression``, ``LinearRegression``
and ``Ridge``. scikit-learn (the ``sklearn`` extra) is imported only when called.

The layout swap happens here, explicitly: an MLP's ``coefs_[i]`` is stored
``(in_features, out_features)`` — it computes ``x @ coefs_[i]`` — while a linearkit ``Linear``
keeps ``weight (out_features, in_features)`` and computes ``x @ weight.T``. A square layer
loaded without the transpose has the right shapes and wrong outputs, so every weight below is
transposed by name, never guessed from its shape. The linear models' ``coef_`` is already
``(n_outputs, n_features)`` (or ``(n_features,)`` for one output) and is not transposed.

What the model outputs, for an input ``x (N, n_features)``:

- MLPClassifier or LogisticRegression, multiclass (softmax): K = n_classes, ``predict_proba(x)``;
- MLPClassifier, multilabel (one sigmoid per label): K = n_labels, ``predict_proba(x)``;
- MLPClassifier or LogisticRegression, binary (one sigmoid): K = 1, P(``classes_[1]``), which
  is ``predict_proba(x)[:, 1:]``;
- MLPRegressor, LinearRegression, Ridge: K = n_targets, ``predict(x)`` (``.ravel()`` of it for
  one target, where ``predict`` returns ``(N,)``).

A binary classifier's model outputs the one probability its last layer computes; scikit-learn
adds the column ``1 - p`` in ``predict_proba``. :func:`predict_proba_like` adds it the same way
(for every one-column output, as ``MLPClassifier.predict_proba`` does), and
``estimator.classes_[predict_proba_like(y).argmax(-1)]`` is ``predict(x)``.
"""

from __future__ import annotations

import numpy as np

from ..layers import Identity, Linear, ReLU, Sequential, Sigmoid, Softmax, Tanh
from ..layers.linear import linear_from

__all__ = ["from_sklearn", "predict_proba_like"]

SUPPORTED = ("MLPClassifier", "MLPRegressor", "LogisticRegression", "LinearRegression", "Ridge")

# scikit-learn's ACTIVATIONS names -> the linearkit layer that computes the same function.
_HIDDEN = {"identity": Identity, "logistic": Sigmoid, "tanh": Tanh, "relu": ReLU}
_OUTPUT = {"identity": None, "logistic": Sigmoid, "softmax": lambda: Softmax(dim=-1)}


def _sklearn():
    try:
        import sklearn.exceptions
        import sklearn.linear_model
        import sklearn.neural_network
        import sklearn.utils.validation
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "from_sklearn needs scikit-learn: pip install 'linearkit[sklearn]' "
            "(or pip install scikit-learn)") from None
    return sklearn


def from_sklearn(estimator, *, dtype=np.float32):
    """A linearkit model (in eval mode) that computes what a fitted scikit-learn estimator does.

    Parameters
    ----------
    estimator : a fitted ``MLPClassifier``, ``MLPRegressor``, ``LogisticRegression``,
        ``LinearRegression`` or ``Ridge``.
    dtype : float32 (default) or float64
        The parameters' dtype. scikit-learn computes in float64: use float64 to match its
        outputs to ~1e-12, float32 to ~1e-6 relative.

    Returns
    -------
    Sequential
        For an MLP: ``Linear, act, Linear, act, ..., Linear[, out]`` where ``act`` is the
        hidden activation (Identity, Sigmoid, Tanh, ReLU) and ``out`` the output function
        (Softmax(dim=-1), Sigmoid, or none for identity). For LogisticRegression:
        ``Linear, Sigmoid`` (binary, one logit) or ``Linear, Softmax(dim=-1)``.
    Linear
        For LinearRegression and Ridge: one ``Linear(n_features, n_targets)``.

    Shape
    -----
    x ``(*, n_features)`` -> ``(*, K)``, K as in the module's table: a binary classifier gives
    K = 1, P(``classes_[1]``); :func:`predict_proba_like` turns it into ``predict_proba``'s
    two columns.

    Raises
    ------
    TypeError
        An estimator type other than the supported ones.
    ValueError
        An unfitted estimator, or an MLP whose activation has no linearkit layer (such as
        MLPRegressor(loss='poisson')'s 'exp' output).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LinearRegression
    >>> from linearkit.io.sklearn import from_sklearn
    >>> x = np.arange(12.0).reshape(6, 2) ** 0.5
    >>> reg = LinearRegression().fit(x, x @ [1.0, -2.0] + 3.0)
    >>> model = from_sklearn(reg, dtype=np.float64)
    >>> model
    Linear(in_features=2, out_features=1, bias=True)
    >>> bool(np.allclose(model(x).ravel(), reg.predict(x)))
    True
    """
    sk = _sklearn()
    kind = type(estimator).__name__
    nn, lm = sk.neural_network, sk.linear_model
    if not isinstance(estimator, (nn.MLPClassifier, nn.MLPRegressor, lm.LogisticRegression,
                                  lm.LinearRegression, lm.Ridge)):
        raise TypeError(
            f"from_sklearn: cannot convert a {kind} ({type(estimator).__module__}.{kind}); "
            f"supported: {', '.join(SUPPORTED)}. For another model, build the linearkit layers "
            "yourself and load its weights with load_state_dict")
    try:
        sk.utils.validation.check_is_fitted(estimator)
    except sk.exceptions.NotFittedError:
        raise ValueError(
            f"from_sklearn: this {kind} is not fitted yet, so it has no weights to convert; "
            f"call estimator.fit(X, y) first") from None
    if isinstance(estimator, (nn.MLPClassifier, nn.MLPRegressor)):
        model = _mlp(estimator, kind, dtype)
    elif isinstance(estimator, lm.LogisticRegression):
        model = _logistic(estimator, kind, dtype)
    else:
        model = _linear(estimator.coef_, estimator.intercept_, estimator, dtype)
    return model.eval()


def predict_proba_like(y: np.ndarray) -> np.ndarray:
    """``predict_proba``'s columns from a converted classifier's output ``y``.

    A one-column output ``p (*, 1)`` — a binary classifier's P(classes_[1]) — becomes
    ``(*, 2)``: ``[1 - p, p]``, as scikit-learn stacks it. Any other output (softmax over the
    classes, a multilabel model's per-label sigmoids) already is ``predict_proba`` and is
    returned unchanged.

    >>> predict_proba_like(np.array([[0.25], [0.5]]))
    array([[0.75, 0.25],
           [0.5 , 0.5 ]])
    """
    y = np.asarray(y)
    if y.ndim >= 1 and y.shape[-1] == 1:
        return np.concatenate([1 - y, y], axis=-1)
    return y


def _mlp(estimator, kind: str, dtype) -> Sequential:
    hidden = _HIDDEN.get(estimator.activation)
    if hidden is None:
        raise ValueError(
            f"from_sklearn: {kind} has hidden activation {estimator.activation!r}, which has no "
            f"linearkit layer; supported: {', '.join(map(repr, _HIDDEN))}. Refit it with one "
            "of those (activation='relu', ...)")
    if estimator.out_activation_ not in _OUTPUT:
        raise ValueError(
            f"from_sklearn: {kind} has output function {estimator.out_activation_!r} (from "
            f"loss={getattr(estimator, 'loss', None)!r}), which has no linearkit layer; "
            f"supported: {', '.join(map(repr, _OUTPUT))}. Refit it with the default loss")
    layers = []
    last = len(estimator.coefs_) - 1
    for i, (coef, intercept) in enumerate(zip(estimator.coefs_, estimator.intercepts_)):
        # scikit-learn computes x @ coefs_[i] with coefs_[i] (in, out); Linear computes
        # x @ weight.T with weight (out, in): the layout swap, done here, by name.
        weight = np.asarray(coef).T
        layers.append(linear_from(weight, np.asarray(intercept), dtype))
        if i != last:
            layers.append(hidden())
    out = _OUTPUT[estimator.out_activation_]
    if out is not None:
        layers.append(out())
    return Sequential(*layers)


def _logistic(estimator, kind: str, dtype) -> Sequential:
    n_classes = len(estimator.classes_)
    # scikit-learn < 1.7 had multi_class: 'ovr' (one-vs-rest) normalizes per-class sigmoids,
    # which no layer computes. From 1.7 on (and for 'multinomial') predict_proba is the softmax
    # of the decision function; binary is always the sigmoid of its one logit.
    multi = getattr(estimator, "multi_class", "multinomial")
    if multi in ("auto", "deprecated", "warn"):
        multi = "ovr" if getattr(estimator, "solver", None) == "liblinear" else "multinomial"
    if n_classes > 2 and multi == "ovr":
        raise ValueError(
            f"from_sklearn: this {kind} is one-vs-rest over {n_classes} classes "
            "(multi_class='ovr'), whose predict_proba normalizes per-class sigmoids, which no "
            "linearkit layer computes; refit it with multi_class='multinomial' (a softmax)")
    linear = _linear(estimator.coef_, estimator.intercept_, estimator, dtype)
    return Sequential(linear, Sigmoid() if n_classes <= 2 else Softmax(dim=-1))


def _linear(coef, intercept, estimator, dtype) -> Linear:
    """One Linear from a linear model's ``coef_`` ((n_features,) or (n_outputs, n_features),
    already the (out, in) layout) and ``intercept_`` (a scalar or (n_outputs,))."""
    coef = np.asarray(coef)
    weight = coef.reshape(1, -1) if coef.ndim == 1 else coef
    bias = None
    if getattr(estimator, "fit_intercept", True):
        bias = np.broadcast_to(np.asarray(intercept, dtype=np.float64).ravel(), weight.shape[:1])
    return linear_from(weight, bias, dtype)
