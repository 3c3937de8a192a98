"""Data- and tensor-parallel checks, run under ``mpirun -n 2`` by tests/test_distributed.py.

Every rank runs every check (each asserts on its own rank); rank 0 writes
``{check: {rank: "ok" | traceback}}`` plus each check's details as JSON to ``sys.argv[1]``.
Float64 throughout, tolerance 1e-12 (atol and rtol) against one process on the full batch.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback

import numpy as np

import linearkit as lk
from linearkit import distributed as D
from linearkit.data import DataLoader
from linearkit.training.accumulation import accumulated_step
from linearkit.training.amp import GradScaler

TOL = {"atol": 1e-12, "rtol": 1e-12}
RANK, SIZE = D.rank(), D.world_size()
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def close(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert np.allclose(a, b, **TOL), f"{what}: max abs diff {err:.3g}"
    return err


def same_everywhere(arrays, what):
    """Bitwise the same arrays on every rank."""
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])[None]
    every = D.allgather_rows(flat)
    assert (every == every[0]).all(), f"{what}: the ranks differ"


def make_model(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return lk.Sequential(
        lk.Linear(7, 16, dtype=dtype, rng=rng), lk.Tanh(),
        lk.Residual(lk.Sequential(lk.Linear(16, 16, dtype=dtype, rng=rng), lk.ReLU())),
        lk.LayerNorm(16, dtype=dtype), lk.Linear(16, 4, dtype=dtype, rng=rng))


def data(rows=96):
    rng = np.random.default_rng(5)
    return rng.standard_normal((rows, 7)), rng.integers(0, 4, rows)


def reference(steps, batch, clip):
    """One process, the full batch of every step, no accumulation."""
    model = make_model(1)
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    x, y = data()
    loader = DataLoader(x, y, batch_size=batch, shuffle=True, drop_last=True, seed=3)
    losses = []
    while len(losses) < steps:
        for xb, yb in loader:
            losses.append(accumulated_step(model, lk.CrossEntropyLoss(), opt, xb, yb, clip=clip))
            if len(losses) == steps:
                break
    return model, losses


def data_parallel(steps, batch, clip, micro_batches, **reducer_args):
    model = make_model(1 + 10 * RANK)     # different on every rank until the broadcast
    D.broadcast_parameters(model)
    opt = lk.optim.Adam(model.parameters(), lr=1e-2)
    reducer = D.GradientReducer(model, **reducer_args)
    x, y = data()
    loader = DataLoader(x, y, batch_size=batch, shuffle=True, drop_last=True, seed=3)
    losses = []
    while len(losses) < steps:
        for xb, yb in loader:
            xs, ys = D.shard_batch(xb, yb)
            losses.append(D.step(model, lk.CrossEntropyLoss(), opt, xs, ys, reducer=reducer,
                                 micro_batches=micro_batches, clip=clip))
            if len(losses) == steps:
                break
    return model, losses, reducer


def compare_training(**kwargs):
    ref, ref_losses = reference(20, 12, clip=0.05)
    dp, losses, reducer = data_parallel(20, 12, clip=0.05, **kwargs)
    errs = [close(p.data, q.data, f"weight {n}")
            for (n, p), q in zip(dp.named_parameters(), ref.parameters())]
    close(losses, ref_losses, "losses")
    same_everywhere([p.data for p in dp.parameters()], "weights")
    return {"max_weight_diff": max(errs), **reducer.stats, "bytes_per_step": reducer.bytes_per_step}


@check
def dp_adam_clip_accumulation():
    """20 steps, Adam + clip_grad_norm_ + 2 micro-batches per rank, small buckets."""
    return compare_training(micro_batches=2, bucket_bytes=1024)


@check
def dp_averaged_gradient_is_the_full_batch_gradient():
    """Adam and clipping hide a wrongly scaled gradient; compare the gradient itself."""
    x, y = data(12)
    ref = make_model(1)
    from linearkit.training.accumulation import accumulate

    accumulate(ref, lk.CrossEntropyLoss(), x, y, micro_batches=1)
    model = make_model(1)
    reducer = D.GradientReducer(model, bucket_bytes=512)
    xs, ys = D.shard_batch(x, y)
    with reducer.no_sync():
        loss = accumulate(model, lk.CrossEntropyLoss(), xs, ys, micro_batches=3)
    loss = reducer.synchronize(loss)
    full = float(lk.CrossEntropyLoss()(ref(x), y))
    close(loss, full, "loss")
    errs = [close(p.grad, q.grad, f"grad {n}")
            for (n, p), q in zip(model.named_parameters(), ref.parameters())]
    return {"max_grad_diff": max(errs)}


@check
def dp_overlap_one_bucket_per_layer():
    """The overlap path: buckets start during the backward."""
    out = compare_training(micro_batches=1, bucket_bytes=1024, overlap=True)
    assert out["early"] > 0, "no bucket started during the backward"
    return out


@check
def dp_buckets_do_not_change_bits():
    a, _, ra = data_parallel(3, 12, None, 1, bucket_bytes=256)
    b, _, rb = data_parallel(3, 12, None, 1)
    assert ra.stats["buckets"] > rb.stats["buckets"] == 3, (ra.stats, rb.stats)
    for p, q in zip(a.parameters(), b.parameters()):
        assert np.array_equal(p.data, q.data)
    return {"small": ra.stats["buckets"] // 3, "default": rb.stats["buckets"] // 3}


class Branchy(lk.Module):
    """y = a(x) (+ b(x) where use_b); c is never used."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.a, self.b, self.c = (lk.Linear(3, 2, dtype=np.float64, rng=rng) for _ in range(3))
        self.use_b = False

    def forward(self, x):
        return self.a(x) + self.b(x) if self.use_b else self.a(x)

    def vjp(self, x, input_grad=True):
        ya, back_a = self.a.vjp(x, input_grad)
        if not self.use_b:
            return ya, back_a
        yb, back_b = self.b.vjp(x, input_grad)

        def backward(dy):
            da, db = back_a(dy), back_b(dy)
            return None if da is None else da + db

        return ya + yb, backward


@check
def dp_frozen_and_missing_gradients():
    model = Branchy()
    model.a.bias.requires_grad = False
    model.use_b = RANK == 1                       # b has a gradient on rank 1 only
    reducer = D.GradientReducer(model, overlap=True)
    x = np.random.default_rng(RANK).standard_normal((4, 3))
    pred, back = model.vjp(x, input_grad=False)
    back(np.ones_like(pred))
    local = {n: p.grad.copy() for n, p in model.named_parameters() if p.grad is not None}
    every = D.allgather_rows(np.concatenate(
        [local.get(n, np.zeros(p.shape)).ravel() for n, p in model.named_parameters()])[None])
    reducer.synchronize()
    mean = every.mean(axis=0)
    offset = 0
    for n, p in model.named_parameters():
        want = mean[offset:offset + p.size].reshape(p.shape)
        offset += p.size
        if n.startswith("c.") or n == "a.bias":
            assert p.grad is None, f"{n} should keep grad None (unused / frozen everywhere)"
        else:
            close(p.grad, want, n)
    trainable = sum(p.size for p in model.parameters() if p.requires_grad)
    assert reducer.bytes_per_step == 8 * trainable, reducer.bytes_per_step
    return {"bytes_per_step": reducer.bytes_per_step}


@check
def dp_one_buffer_per_dtype():
    p32 = lk.Parameter(np.zeros(5, np.float32))
    p64 = lk.Parameter(np.zeros((2, 3)))
    p16 = lk.Parameter(np.zeros(4, np.float16))
    for p in (p32, p64, p16):
        p.grad = ((RANK + 1.0) * np.arange(1, p.size + 1).reshape(p.shape)).astype(p.dtype)
    reducer = D.GradientReducer([p32, p64, p16])
    reducer.synchronize()
    assert reducer.stats["buckets"] == 2, reducer.stats  # float32 (with the float16) + float64
    for p in (p32, p64, p16):
        want = np.arange(1, p.size + 1).reshape(p.shape) * (1 + SIZE) / 2
        assert p.grad.dtype == p.dtype
        close(p.grad.astype(np.float64), want, str(p.dtype))
    return reducer.stats


@check
def dp_scaler_skips_on_every_rank():
    model = make_model(1, np.float32)
    opt = lk.optim.SGD(model.parameters(), lr=0.1)
    reducer = D.GradientReducer(model)
    scaler = GradScaler(init_scale=1024.0)
    x, y = data(8)
    xs, ys = D.shard_batch(x.astype(np.float32), y)
    poison = {"on": False}

    def hook(module, grad_input, grad_output):
        if poison["on"] and RANK == 1:
            module.weight.grad[0, 0] = np.inf   # only rank 1's gradient overflows

    model[0].register_full_backward_hook(hook)
    scales, changed = [], []
    for step in range(3):
        poison["on"] = step == 1
        before = [p.data.copy() for p in model.parameters()]
        D.step(model, lk.CrossEntropyLoss(), opt, xs, ys, reducer=reducer, scaler=scaler)
        scales.append(scaler.get_scale())
        changed.append(any(not np.array_equal(b, p.data) for b, p in zip(before, model.parameters())))
        same_everywhere([p.data for p in model.parameters()], f"weights after step {step}")
    assert scales == [1024.0, 512.0, 512.0], scales
    assert changed == [True, False, True], changed
    return {"scales": scales, "stepped": changed}


@check
def broadcast_parameters_and_buffers():
    rng = np.random.default_rng(RANK)
    model = lk.Sequential(lk.Linear(3, 4, rng=rng), lk.BatchNorm1d(4),
                          lk.Linear(4, 2, dtype="bfloat16", rng=rng))
    model.train()
    model[1](rng.standard_normal((5, 4)).astype(np.float32) * (RANK + 1))  # running stats
    D.broadcast_parameters(model)
    sd = model.state_dict()
    for k, v in sd.items():
        v = np.asarray(v, np.float64)
        every = D.allgather_rows(v.reshape(1, -1))
        assert (every == every[0]).all(), f"{k} differs after the broadcast"
    return {"keys": len(sd)}


# ---------------------------------------------------------------------- tensor parallel
def count_collectives():
    """Count the calls of the collectives the layers use (patched where they look them up)."""
    calls = {"allreduce_": 0, "allgather_rows": 0}
    originals = {name: getattr(D.comm, name) for name in calls}
    for name, original in originals.items():

        def counted(*args, _original=original, _name=name, **kw):
            calls[_name] += 1
            return _original(*args, **kw)

        setattr(D.comm, name, counted)

    def restore():
        for name, original in originals.items():
            setattr(D.comm, name, original)

    return calls, restore


def tp_case(full, shard, x, dy):
    y, back = shard.vjp(x)
    dx = back(dy)
    y_ref, back_ref = full.vjp(x)
    dx_ref = back_ref(dy)
    errs = [close(y, y_ref, "y"), close(dx, dx_ref, "dx")]
    lo, hi = shard.lo, shard.hi
    if isinstance(shard, D.ColumnParallelLinear):
        errs += [close(shard.weight.grad, full.weight.grad[lo:hi], "dW"),
                 close(shard.bias.grad, full.bias.grad[lo:hi], "db")]
    else:
        errs += [close(shard.weight.grad, full.weight.grad[:, lo:hi], "dW"),
                 close(shard.bias.grad, full.bias.grad, "db")]
    return max(errs)


@check
def tp_column_and_row_alone_uneven():
    rng = np.random.default_rng(11)
    x, dy = rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 7))
    out = {}
    for mode in ("column", "row"):
        full = lk.Linear(8, 7, dtype=np.float64, rng=np.random.default_rng(2))
        shard = D.shard_linear(full, mode=mode)
        out[mode] = tp_case(full, shard, x, dy)
        again = D.gather_linear(shard)
        assert np.array_equal(again.weight.data, full.weight.data)
        assert np.array_equal(again.bias.data, full.bias.data)
        built = (D.ColumnParallelLinear if mode == "column" else D.RowParallelLinear)(
            8, 7, dtype=np.float64, rng=np.random.default_rng(2))
        assert np.array_equal(built.weight.data, shard.weight.data), f"{mode} init"
        assert np.array_equal(built.bias.data, shard.bias.data)
    return out


@check
def tp_parallel_mlp_one_allreduce_each_way():
    rng = np.random.default_rng(12)
    fc1 = lk.Linear(8, 9, dtype=np.float64, rng=rng)   # 9 hidden: 5 + 4 over two ranks
    fc2 = lk.Linear(9, 6, dtype=np.float64, rng=rng)
    ref = lk.Sequential(copy.deepcopy(fc1), lk.GELU(), copy.deepcopy(fc2))
    tp = D.parallel_mlp(fc1, lk.GELU(), fc2)
    x, dy = rng.standard_normal((4, 3, 8)), rng.standard_normal((4, 3, 6))
    calls, restore = count_collectives()
    y, back = tp.vjp(x)
    forward = dict(calls)
    dx = back(dy)
    backward = {k: calls[k] - forward[k] for k in calls}
    _, back_no_dx = tp.vjp(x, input_grad=False)
    before = dict(calls)
    back_no_dx(dy)
    no_dx = {k: calls[k] - before[k] for k in calls}
    restore()
    tp.zero_grad()
    y, back = tp.vjp(x)
    dx = back(dy)
    y_ref, back_ref = ref.vjp(x)
    dx_ref = back_ref(dy)
    errs = [close(y, y_ref, "y"), close(dx, dx_ref, "dx")]
    col, row = tp[0], tp[2]
    errs += [close(col.weight.grad, ref[0].weight.grad[col.lo:col.hi], "fc1 dW"),
             close(col.bias.grad, ref[0].bias.grad[col.lo:col.hi], "fc1 db"),
             close(row.weight.grad, ref[2].weight.grad[:, row.lo:row.hi], "fc2 dW"),
             close(row.bias.grad, ref[2].bias.grad, "fc2 db")]
    assert forward == {"allreduce_": 1, "allgather_rows": 0}, forward
    assert backward == {"allreduce_": 1, "allgather_rows": 0}, backward
    assert no_dx == {"allreduce_": 0, "allgather_rows": 0}, no_dx
    report = lk.analysis.ledger(tp, (12, 8))
    params = [report[p].params for p in ("0", "2")]
    assert params == [col.weight.size + col.bias.size, row.weight.size + row.bias.size], params
    assert "forward all-reduce" in report["2"].note, report["2"].note
    return {"max_err": max(errs), "forward": forward, "backward": backward,
            "ledger_params": params, "notes": [report["0"].note, report["2"].note]}


def main(out_path):
    results = {}
    for fn in CHECKS:
        try:
            results[fn.__name__] = {"ok": True, "detail": fn()}
        except Exception:  # noqa: BLE001 - every failure is reported, the other checks run
            results[fn.__name__] = {"ok": False, "detail": traceback.format_exc()}
    every = D.comm.get_comm().gather(results, root=0)
    if RANK == 0:
        merged = {name: {str(r): every[r][name] for r in range(SIZE)} for name in results}
        with open(out_path, "w") as f:
            json.dump(merged, f, indent=1, default=str)


if __name__ == "__main__":
    with D.abort_on_error():
        main(sys.argv[1])
