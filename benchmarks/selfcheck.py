"""``python -m benchmarks.selfcheck``: the benchmarked implementations compute the same thing.

Trains the recipe model (residual) and the 784-256-256-10 MLP for a few Adam steps from the same
initial weights in every available framework and compares the final weights with PyTorch's
(correctness only, in one process; never used for timing). Exit status 1 on a mismatch.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from . import cases, data

STEPS = 5


def _batches(sizes, batch):
    return data.classification_batches(batch, sizes[0], sizes[-1], data.rng(1), count=STEPS)


def numpy_weights(sizes, residual, lr, batch):
    from .impl_numpy import MLP

    net = MLP(sizes, batch, lr, residual=residual)
    for x, y in _batches(sizes, batch):
        net.train_step(x, y)
    return [a.copy() for pair in net.layers for a in pair]


def torch_weights(sizes, residual, lr, batch, fused=False):
    from . import impl_torch

    impl_torch.check()
    model = impl_torch.build_model(sizes, residual)
    step = impl_torch.trainer(model, lr, fused)
    for x, y in _batches(sizes, batch):
        step(impl_torch.tensor(x), impl_torch.tensor(y))
    return [p.detach().numpy().copy() for p in model.parameters()]


def linearkit_weights(sizes, residual, lr, batch):
    from . import impl_linearkit

    impl_linearkit.check()
    model = impl_linearkit.build_model(sizes, residual)
    step = impl_linearkit.trainer(model, lr)
    for x, y in _batches(sizes, batch):
        step(x, y)
    return [p.data.copy() for p in model.parameters()]


def jax_weights(sizes, residual, lr, batch):
    from . import impl_jax

    impl_jax.check()
    params = impl_jax.init(sizes)
    state = impl_jax.adam_state(params)
    step = impl_jax.make_step(lr, residual)
    for x, y in _batches(sizes, batch):
        params, state, _ = step(params, state, x, y)
    return [np.asarray(a) for pair in params for a in pair]


def main() -> int:
    have = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax")}
    if not have["torch"]:
        print("selfcheck needs torch as the reference", file=sys.stderr)
        return 1
    r = cases.RECIPE
    models = [("recipe", (r["in"], r["hidden"], r["hidden"], r["classes"]), True, r["lr"], 100),
              ("mlp", cases.MLP_SIZES, False, cases.MLP_LR, 32)]
    impls = [("numpy", numpy_weights), ("linearkit", linearkit_weights),
             ("torch fused", lambda *a: torch_weights(*a, fused=True))]
    if have["jax"]:
        impls.append(("jax", jax_weights))
    failed = False
    for name, sizes, residual, lr, batch in models:
        ref = torch_weights(sizes, residual, lr, batch)
        for impl, fn in impls:
            try:
                got = fn(sizes, residual, lr, batch)
                diff = np.concatenate([np.abs(a - b).ravel()
                                       for a, b in zip(got, ref, strict=True)])
                err = float(diff.max())
                # Adam moves every weight by up to lr per step whatever the gradient's size, so
                # float32 rounding in a near-zero gradient can flip a few updates: require all
                # but 1% of the weights to agree within lr/100.
                off = float(np.mean(diff > lr / 100))
                ok = off <= 0.01
                status = f"{100 * off:.2f}% off by > lr/100  " + ("ok" if ok else "MISMATCH")
            except Exception as exc:  # noqa: BLE001
                err, ok, status = float("nan"), False, f"ERROR {type(exc).__name__}: {exc}"
            failed |= not ok
            print(f"{name:7s} {impl:12s} max |w - w_torch| = {err:.2e}  {status}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
