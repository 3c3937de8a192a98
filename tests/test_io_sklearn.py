"""linearkit.io.sklearn: fitted scikit-learn estimators -> linearkit models, checked against
``predict_proba`` / ``predict`` on scikit-learn's bundled digits and diabetes data."""

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import linearkit as lk

sklearn = pytest.importorskip("sklearn")

from sklearn.datasets import load_diabetes, load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.svm import SVC

from linearkit.io.sklearn import from_sklearn, predict_proba_like

# torch.testing.assert_close's float32 defaults; float64 is held far tighter than its default.
F32 = {"rtol": 1.3e-6, "atol": 1e-5}
F64 = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


@pytest.fixture(scope="module")
def diabetes():
    x, y = load_diabetes(return_X_y=True)
    return x, y


def fit(estimator, x, y):
    with warnings.catch_warnings():  # max_iter is kept small so the file runs fast
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(x, y)


def assert_outputs(estimator, x, reference, *, proba):
    """The float64 model matches ``reference(x)`` tightly, the float32 one to float32 tolerance,
    and (for a classifier) the predicted labels agree."""
    for dtype, tol in ((np.float64, F64), (np.float32, F32)):
        model = from_sklearn(estimator, dtype=dtype)
        assert not model.training
        assert all(p.dtype == dtype for p in model.parameters())
        out = model(x.astype(dtype))
        got = predict_proba_like(out) if proba else out
        want = reference(x)
        want = want.reshape(len(x), -1)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **tol)
        if proba and dtype == np.float64:
            np.testing.assert_array_equal(estimator.classes_[got.argmax(-1)], estimator.predict(x))
        elif proba:  # float32: labels agree wherever the top two are not within rounding
            top2 = np.sort(want, axis=-1)[:, -2:]
            clear = top2[:, 1] - top2[:, 0] > 1e-4
            assert clear.mean() > 0.95
            np.testing.assert_array_equal(estimator.classes_[got.argmax(-1)][clear],
                                          estimator.predict(x)[clear])


# ------------------------------------------------------------------ MLPClassifier
@pytest.mark.parametrize("activation", ["identity", "logistic", "tanh", "relu"])
def test_mlp_classifier_multiclass_matches_predict_proba(digits, activation):
    x, y = digits
    clf = fit(MLPClassifier(hidden_layer_sizes=(24, 16), activation=activation, max_iter=30,
                            random_state=0), x, y)
    assert clf.out_activation_ == "softmax"
    model = from_sklearn(clf)
    kinds = [type(m).__name__ for m in model]
    hidden = {"identity": "Identity", "logistic": "Sigmoid", "tanh": "Tanh", "relu": "ReLU"}
    assert kinds == ["Linear", hidden[activation], "Linear", hidden[activation], "Linear",
                     "Softmax"]
    assert model[0].weight.shape == (24, 64)  # (out, in): coefs_[0] is (64, 24)
    assert (clf.predict(x) == y).mean() > 0.5  # a model that learned something (0.1: chance)
    assert_outputs(clf, x, clf.predict_proba, proba=True)


def test_mlp_classifier_binary_outputs_p_of_class_one(digits):
    x, y = digits
    keep = (y == 3) | (y == 8)
    x, y = x[keep], np.where(y[keep] == 8, "eight", "three")
    clf = fit(MLPClassifier(hidden_layer_sizes=(16,), activation="tanh", max_iter=30,
                            random_state=0), x, y)
    assert clf.out_activation_ == "logistic"
    model = from_sklearn(clf, dtype=np.float64)
    p = model(x)
    assert p.shape == (len(x), 1)
    np.testing.assert_allclose(p[:, 0], clf.predict_proba(x)[:, 1], **F64)
    assert_outputs(clf, x, clf.predict_proba, proba=True)


def test_mlp_classifier_multilabel_is_one_sigmoid_per_label(digits):
    x, y = digits
    labels = np.stack([y % 2 == 0, y > 4, y == 7], axis=1).astype(int)
    clf = fit(MLPClassifier(hidden_layer_sizes=(16,), activation="relu", max_iter=30,
                            random_state=0), x, labels)
    assert clf.out_activation_ == "logistic"
    assert type(from_sklearn(clf)[-1]).__name__ == "Sigmoid"
    assert_outputs(clf, x, clf.predict_proba, proba=False)


# ------------------------------------------------------------------ LogisticRegression
def test_logistic_regression_multiclass_is_softmax(digits):
    x, y = digits
    clf = fit(LogisticRegression(max_iter=200), x, y)
    model = from_sklearn(clf)
    assert [type(m).__name__ for m in model] == ["Linear", "Softmax"]
    assert model[0].weight.shape == (10, 64)
    assert_outputs(clf, x, clf.predict_proba, proba=True)


def test_logistic_regression_binary_is_one_logit_and_sigmoid(digits):
    x, y = digits
    clf = fit(LogisticRegression(max_iter=200), x, y == 0)
    model = from_sklearn(clf, dtype=np.float64)
    assert [type(m).__name__ for m in model] == ["Linear", "Sigmoid"]
    assert model[0].weight.shape == (1, 64)
    # The Linear alone is the decision function; with the Sigmoid it is P(classes_[1]).
    np.testing.assert_allclose(model[0](x)[:, 0], clf.decision_function(x), **F64)
    np.testing.assert_allclose(model(x)[:, 0], clf.predict_proba(x)[:, 1], **F64)
    assert_outputs(clf, x, clf.predict_proba, proba=True)


def test_logistic_regression_without_intercept_has_no_bias(digits):
    x, y = digits
    clf = fit(LogisticRegression(fit_intercept=False, max_iter=100), x, y)
    model = from_sklearn(clf)
    assert model[0].bias is None
    assert_outputs(clf, x, clf.predict_proba, proba=True)


# ------------------------------------------------------------------ regressors
def multi_target(y):
    return np.stack([y, np.sqrt(y), -0.5 * y], axis=1)


@pytest.mark.parametrize("targets", ["single", "multi"])
def test_mlp_regressor_matches_predict(diabetes, targets):
    x, y = diabetes
    y = (y - y.mean()) / y.std()
    y = y if targets == "single" else multi_target(y + 3)
    reg = fit(MLPRegressor(hidden_layer_sizes=(32, 16), activation="relu", max_iter=50,
                           random_state=0), x, y)
    model = from_sklearn(reg)
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert model(x.astype(np.float32)).shape == (len(x), 1 if targets == "single" else 3)
    assert_outputs(reg, x, reg.predict, proba=False)


@pytest.mark.parametrize("estimator", [LinearRegression(), Ridge(alpha=0.5),
                                       LinearRegression(fit_intercept=False),
                                       Ridge(alpha=2.0, fit_intercept=False)],
                         ids=["linear", "ridge", "linear-no-intercept", "ridge-no-intercept"])
@pytest.mark.parametrize("targets", ["single", "column", "multi"])
def test_linear_models_are_one_linear(diabetes, estimator, targets):
    x, y = diabetes
    y = {"single": y, "column": y[:, None], "multi": multi_target(y)}[targets]
    reg = sklearn.clone(estimator).fit(x, y)
    model = from_sklearn(reg)
    assert isinstance(model, lk.Linear) and not model.training
    assert model.weight.shape == (1 if targets != "multi" else 3, 10)
    assert (model.bias is None) == (not estimator.fit_intercept)
    assert_outputs(reg, x, reg.predict, proba=False)


# ------------------------------------------------------------------ the layout matters
def test_coefs_loaded_without_the_transpose_give_wrong_predictions(diabetes):
    """A square hidden layer (10 -> 10) loaded from coefs_ as stored, (in, out): every shape
    check passes, the model runs, and its predictions are wrong."""
    x, y = diabetes
    y = (y - y.mean()) / y.std()
    reg = fit(MLPRegressor(hidden_layer_sizes=(10,), activation="tanh", max_iter=200,
                           random_state=0), x, y)
    assert reg.coefs_[0].shape == (10, 10)
    right = from_sklearn(reg, dtype=np.float64)
    wrong = from_sklearn(reg, dtype=np.float64)
    wrong[0].weight.data[...] = reg.coefs_[0]  # the (in, out) kernel, not transposed
    assert wrong[0].weight.shape == right[0].weight.shape
    np.testing.assert_allclose(right(x)[:, 0], reg.predict(x), **F64)
    error = np.abs(wrong(x)[:, 0] - reg.predict(x))
    assert error.max() > 0.1 * reg.predict(x).std()


# ------------------------------------------------------------------ bad input
def test_unsupported_estimator_is_a_type_error_naming_it(digits):
    x, y = digits
    svc = SVC().fit(x[:200], y[:200])
    with pytest.raises(TypeError, match=r"SVC.*supported: MLPClassifier, MLPRegressor, "
                                        r"LogisticRegression, LinearRegression, Ridge"):
        from_sklearn(svc)
    with pytest.raises(TypeError, match="cannot convert a ndarray"):
        from_sklearn(np.zeros((2, 2)))


@pytest.mark.parametrize("estimator", [MLPClassifier(), MLPRegressor(), LogisticRegression(),
                                       LinearRegression(), Ridge()])
def test_unfitted_estimator_says_fit_it_first(estimator):
    with pytest.raises(ValueError, match=rf"this {type(estimator).__name__} is not fitted yet"
                                         r".*call estimator\.fit\(X, y\) first"):
        from_sklearn(estimator)


def test_mlp_with_an_unknown_activation_is_refused(diabetes):
    x, y = diabetes
    reg = fit(MLPRegressor(hidden_layer_sizes=(4,), max_iter=5, random_state=0), x, y / 100)
    reg.activation = "softplus"
    with pytest.raises(ValueError, match=r"MLPRegressor has hidden activation 'softplus'.*"
                                         r"supported: 'identity', 'logistic', 'tanh', 'relu'"):
        from_sklearn(reg)
    poisson = fit(MLPRegressor(hidden_layer_sizes=(4,), loss="poisson", max_iter=5,
                               random_state=0), x, y / 100)
    with pytest.raises(ValueError, match=r"output function 'exp' \(from loss='poisson'\)"):
        from_sklearn(poisson)


def test_one_vs_rest_logistic_regression_is_refused(digits):
    x, y = digits
    clf = fit(LogisticRegression(max_iter=20), x, y)
    clf.multi_class = "ovr"  # what scikit-learn < 1.7 fitted with multi_class='ovr' carries
    with pytest.raises(ValueError, match=r"one-vs-rest over 10 classes.*multinomial"):
        from_sklearn(clf)


def test_bad_dtype_is_refused(diabetes):
    x, y = diabetes
    with pytest.raises(TypeError, match="dtype must be"):
        from_sklearn(LinearRegression().fit(x, y), dtype=np.int32)


def test_converting_leaves_the_library_random_stream_alone(diabetes):
    x, y = diabetes
    reg = LinearRegression().fit(x, y)
    lk.manual_seed(3)
    expected = lk.Linear(4, 4).weight.data.copy()
    lk.manual_seed(3)
    from_sklearn(reg)
    np.testing.assert_array_equal(lk.Linear(4, 4).weight.data, expected)


def test_missing_scikit_learn_names_the_install():
    script = textwrap.dedent("""
        import sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "sklearn":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, Blocker())
        from linearkit.io.sklearn import from_sklearn
        try:
            from_sklearn(object())
        except ImportError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install scikit-learn" in done.stdout
    assert "linearkit[sklearn]" in done.stdout
