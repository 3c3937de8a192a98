"""PyTorch's own module test cases, run through linearkit.

The cases come from torch's internal test suite (``torch.testing._internal``, which needs the
``expecttest`` package): every ``ModuleInfo`` of ``common_modules.module_db`` for a module
linearkit has (Bilinear, RMSNorm, NLLLoss, BCELoss, SmoothL1Loss, HuberLoss, KLDivLoss), with the
inputs its ``module_inputs_func`` makes, and the ``common_nn.criterion_tests`` entries for those
losses. Per case:

* torch builds its module from the case's constructor arguments, bound to torch's signature;
  linearkit builds its own from the same arguments by name. An argument linearkit deliberately
  does not take (the deprecated ``size_average`` / ``reduce``) skips the case, naming it.
  ``criterion_tests`` gives a constructor, not arguments: linearkit's loss is built from the
  attributes of the module that constructor returns (its ``reduction``, ``weight``, ...).
  Those constructors bind ``reduction`` late (a loop variable), so each of their
  ``*_no_batch_dim_{none,mean,sum}`` cases builds a ``'sum'`` loss; the test runs what torch
  built, whatever the case's name says.
* torch's parameters are redrawn at random (an init of ones cannot hide a bug) and copied into
  linearkit's; the forward outputs must agree in float64 within 1e-10 (relative and absolute).
* every input the case marks ``requires_grad`` gets its gradient compared within 1e-10, and so
  does every parameter's, for a random upstream gradient (a 0-d one for a scalar). linearkit's
  losses return the gradient of the prediction only (``losses.py``); a case whose target
  requires grad too has its prediction's gradient compared and the target's recorded as not
  compared (``record_property``), not silently passed.
* ``common_nn``'s loss entries that wrap a ``torch.nn.functional`` call in a lambda closing over
  its own target (``wrap_functional``) have no constructor arguments to build a linearkit loss
  from: they are skipped, naming that.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings

import numpy as np
import pytest

import linearkit as lk

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's internal test cases need expecttest: "
                                         "pip install expecttest")


def _torch_test_cases():
    """``(module_db, criterion_tests, new_module_tests)``; the import's side effects on this
    process (warning filters, an environment variable) are undone."""
    env = dict(os.environ)
    with warnings.catch_warnings():
        from torch.testing._internal import common_nn
        from torch.testing._internal.common_modules import module_db

        new_module_tests = common_nn.get_new_module_tests()
    for key in set(os.environ) - set(env):
        del os.environ[key]
    return module_db, common_nn.criterion_tests, new_module_tests


MODULE_DB, CRITERION_TESTS, NEW_MODULE_TESTS = _torch_test_cases()
NAMES = ("Bilinear", "RMSNorm", "NLLLoss", "BCELoss", "SmoothL1Loss", "HuberLoss", "KLDivLoss")
TOL = {"rtol": 1e-10, "atol": 1e-10}


# ----------------------------------------------------------------------------- the cases
def _module_db_cases() -> list:
    """``pytest.param((kind, ...))`` for each input of each ModuleInfo of ours, float64."""
    cases = []
    for info in MODULE_DB:
        name = info.module_cls.__name__
        if name not in NAMES:
            continue
        torch.manual_seed(0)
        inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float64,
                                         requires_grad=True, training=True)
        for k, mi in enumerate(inputs):
            desc = mi.desc or "default"
            cases.append(pytest.param(("module_db", name, mi.constructor_input,
                                       mi.forward_input), id=f"module_db-{name}-{k}-{desc}"))
    return cases


def _criterion_cases() -> list:
    cases = []
    for test in CRITERION_TESTS:
        name = test["fullname"].split("_", 1)[0]
        if name in NAMES:
            cases.append(pytest.param(("criterion", name, test),
                                      id=f"common_nn-{test['fullname']}"))
    return cases


def _functional_wrappers() -> list:
    """common_nn's new_module_tests entries for our losses: each a functional call wrapped in
    a lambda (``wrap_functional``), e.g. 'BCELoss_no_reduce'."""
    found = []
    for test in NEW_MODULE_TESTS:
        full = test.get("fullname", "")
        if any(full.startswith(prefix) for prefix in
               ("BCELoss_", "KLDivLoss_", "NLLLoss", "SmoothL1Loss_", "HuberLoss_")):
            found.append(pytest.param(full, id=f"common_nn-{full}"))
    return found


MODULE_DB_CASES = _module_db_cases()
CRITERION_CASES = _criterion_cases()
FUNCTIONAL_WRAPPERS = _functional_wrappers()


# ----------------------------------------------------------------------------- helpers
def _np(value):
    """A tensor as a float64 (or integer) ndarray; anything else as it is."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.double().numpy() if value.is_floating_point() else value.numpy()
    return value


def _linearkit_args(name: str, bound: dict) -> dict:
    """The linearkit constructor's keyword arguments for torch's bound ones; skips the case,
    naming the argument, when linearkit's ``name`` does not take one."""
    ours = inspect.signature(getattr(lk, name)).parameters
    kwargs = {}
    for arg, value in bound.items():
        if arg in ("device", "dtype"):
            continue
        if arg not in ours:
            pytest.skip(f"linearkit.{name} has no option {arg!r} (deprecated in torch: use "
                        f"reduction=...)")
        kwargs[arg] = _np(value)
    if "dtype" in ours:
        kwargs["dtype"] = np.float64
    return kwargs


def _from_constructor_args(name: str, args: tuple, kwargs: dict):
    """(torch module, linearkit module) built from one set of constructor arguments."""
    cls = getattr(torch.nn, name)
    bound = inspect.signature(cls).bind(*args, **kwargs)
    theirs = cls(*args, **kwargs).to(torch.float64)
    return theirs, getattr(lk, name)(**_linearkit_args(name, dict(bound.arguments)))


def _from_torch_loss(name: str, theirs):
    """linearkit's loss ``name`` with the attributes of torch's built one (same names)."""
    params = inspect.signature(getattr(lk, name)).parameters
    kwargs = {arg: _np(getattr(theirs, arg)) for arg in params if hasattr(theirs, arg)}
    return getattr(lk, name)(**kwargs)


def _randomize_and_copy(theirs, ours) -> None:
    """Torch's parameters redrawn (seeded), then loaded into ours: the same values on both."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=p.dtype) * 2 - 1)
    ours.load_state_dict({k: _np(v) for k, v in theirs.state_dict().items()})


def _close(ours, theirs, what: str) -> None:
    np.testing.assert_allclose(np.asarray(ours), _np(theirs), err_msg=what, **TOL)


def _run_and_compare(name, theirs, ours, args, kwargs, record_property) -> None:
    """Forward both on the same inputs, then every requested gradient."""
    assert not kwargs, f"forward keyword arguments {sorted(kwargs)}"
    args = tuple(a.detach().double().requires_grad_(a.requires_grad)
                 if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    out = theirs(*args)
    inputs = [_np(a) for a in args]
    y, backward = ours.vjp(*inputs)
    _close(y, out, "forward")
    assert np.asarray(y).shape == tuple(out.shape) and np.asarray(y).dtype == np.float64
    wanted = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not wanted and not any(p.requires_grad for p in theirs.parameters()):
        return
    dy = np.asarray(np.random.default_rng(2).standard_normal(out.shape))  # 0-d for a scalar
    out.backward(torch.from_numpy(dy))
    loss = name.endswith("Loss")
    grads = backward(dy)
    grads = grads if isinstance(grads, tuple) else (grads,)
    for i in wanted:
        if loss and i > 0:  # the target's gradient: linearkit's losses give dL/dpred only
            record_property(f"input {i} gradient", "not compared: linearkit's losses return "
                                                   "the gradient of the prediction only")
            continue
        _close(grads[i], args[i].grad, f"gradient of input {i}")
    for pname, p in theirs.named_parameters():
        _close(getattr(ours, pname).grad, p.grad, f"gradient of {pname}")


# ----------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("case", MODULE_DB_CASES)
def test_module_db_case(case, record_property):
    _, name, ctor, fwd = case
    theirs, ours = _from_constructor_args(name, tuple(ctor.args), dict(ctor.kwargs))
    _randomize_and_copy(theirs, ours)
    _run_and_compare(name, theirs, ours, tuple(fwd.args), dict(fwd.kwargs), record_property)


@pytest.mark.parametrize("case", CRITERION_CASES)
def test_common_nn_criterion_case(case, record_property):
    _, name, test = case
    dtype = test.get("default_dtype", torch.float64)
    torch.manual_seed(0)
    with _default_dtype(dtype):
        theirs = test["constructor"]().to(torch.float64)
        pred = test["input_fn"]() if "input_fn" in test else torch.randn(test["input_size"])
        target = test["target_fn"]() if "target_fn" in test else torch.randn(test["target_size"])
    ours = _from_torch_loss(name, theirs)
    pred = pred.double().requires_grad_(True)
    target = target.double() if target.is_floating_point() else target
    _run_and_compare(name, theirs, ours, (pred, target), {}, record_property)


@pytest.mark.parametrize("fullname", FUNCTIONAL_WRAPPERS)
def test_common_nn_functional_wrapper(fullname):
    pytest.skip(f"{fullname}: a torch.nn.functional call wrapped in a lambda that closes over "
                "its own target (wrap_functional); it has no constructor arguments to build a "
                "linearkit loss from")


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_the_case_tables_hold_every_module_of_ours():
    """The tables are what this file says: module_db has a ModuleInfo for each of the seven,
    criterion_tests a no-batch-dim case for each loss, and the counts are not empty."""
    in_db = {case.values[0][1] for case in MODULE_DB_CASES}
    assert in_db == set(NAMES)
    in_criterion = {case.values[0][1] for case in CRITERION_CASES}
    assert in_criterion == {"NLLLoss", "BCELoss", "SmoothL1Loss", "HuberLoss", "KLDivLoss"}
    counts = {name: sum(case.values[0][1] == name for case in MODULE_DB_CASES) for name in NAMES}
    assert counts["Bilinear"] >= 3 and counts["RMSNorm"] >= 6, counts
