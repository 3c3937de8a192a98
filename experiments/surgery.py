"""The surgery experiment: every transform of ``linearkit.transforms`` on models trained here,
beside popular claims — the numbers behind docs/surgery.md.

``python -m experiments surgery [--quick] [--out-dir DIR | --write-docs | --no-write]``. It trains
an MLP on MNIST-1D (bundled) and one on scikit-learn's digits, then measures: the factorization
rank sweep (accuracy, parameters, forward time, with and without a short fine-tune), the
article's 100 MB rank-64 layer, int8 (accuracy, size on disk), fold + merge (exactness, FLOPs and
latency saved), one fused QKV GEMM against three, sparse against dense storage across
sparsities, and LoRA fine-tuning on a task the base model gets wrong. Every number on the page
comes from one ``run``; nothing is typed in by hand.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from .pages import machine_info, measure_sections

__all__ = ["Config", "main", "run"]

DEFAULT_OUT_DIR = os.path.join("runs", "surgery")


@dataclass(frozen=True)
class Config:
    """Sizes and lengths of one run; ``Config.quick()`` is the seconds-long smoke version."""

    seed: int = 0
    hidden: int = 256
    steps: int = 3000  # training steps of each base model (Adam, batch 100)
    ranks: tuple = (2, 4, 8, 16, 32, 64)
    tune_steps: int = 300  # fine-tuning steps of each factorized model
    claim_n: int = 5000  # the article's ~100 MB float32 layer: claim_n x claim_n
    claim_rank: int = 64
    qkv_dims: tuple = (64, 256, 768, 1024)
    qkv_batches: tuple = (1, 32, 512)
    sparse_size: int = 1024
    sparse_batches: tuple = (1, 32, 256)
    sparsities: tuple = (0.5, 0.8, 0.9, 0.95, 0.99)
    prune_amounts: tuple = (0.5, 0.8, 0.9, 0.95)
    lora_rank: int = 4
    lora_steps: int = 1000
    repeats: int = 7
    threads: int = 1  # BLAS threads for the whole run (every timing compares at this count)
    quick_run: bool = False

    @classmethod
    def quick(cls, seed: int = 0) -> Config:
        return cls(seed=seed, hidden=32, steps=60, ranks=(2, 8), tune_steps=10, claim_n=600,
                   claim_rank=16, qkv_dims=(32,), qkv_batches=(4,), sparse_size=128,
                   sparse_batches=(4,), sparsities=(0.5, 0.95), prune_amounts=(0.5,),
                   lora_rank=2, lora_steps=20, repeats=2, quick_run=True)


@dataclass
class Task:
    """A dataset and the model trained on it here."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    model: object = None
    train_seconds: float = 0.0


@dataclass
class Result:
    config: Config
    machine: dict
    tasks: dict = field(default_factory=dict)  # name -> {"accuracy", "params", "seconds"}
    sections: dict = field(default_factory=dict)


# ---------------------------------------------------------------- data and base models
def _datasets(seed: int) -> list[Task]:
    from sklearn.datasets import load_digits

    from linearkit.data import mnist1d

    d = mnist1d()
    tasks = [Task("MNIST-1D", d.x_train, d.y_train, d.x_test, d.y_test)]
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    tasks.append(Task("digits", x[train], digits.target[train], x[test], digits.target[test]))
    return tasks


def _mlp(n_in: int, hidden: int, classes: int, rng, norm: bool = False):
    """``n_in -> hidden ReLU -> hidden ReLU -> classes``; with ``norm`` a BatchNorm1d after the
    first Linear and a Linear-Dropout-Linear head with nothing nonlinear between (redundant on
    purpose: what fold and merge remove)."""
    from linearkit import layers as L

    if norm:
        return L.Sequential(L.Linear(n_in, hidden, rng=rng), L.BatchNorm1d(hidden), L.ReLU(),
                            L.Linear(hidden, hidden, rng=rng), L.Dropout(0.1),
                            L.Linear(hidden, classes, rng=rng))
    return L.Sequential(L.Linear(n_in, hidden, rng=rng), L.ReLU(),
                        L.Linear(hidden, hidden, rng=rng), L.ReLU(),
                        L.Linear(hidden, classes, rng=rng))


def _train(task: Task, model, steps: int, seed: int, lr: float = 1e-2):
    from linearkit.recipes.train_mnist1d import train

    start = time.perf_counter()
    model, _ = train(model=model, dataset=(task.x_train, task.y_train, task.x_test, task.y_test),
                     steps=steps, lr=lr, seed=seed, eval_every=0)
    return model.eval(), time.perf_counter() - start


def _accuracy(model, x, y) -> float:
    from linearkit.recipes.train_mnist1d import accuracy

    return accuracy(model, x, y)


def _file_bytes(model, folder: str, name: str) -> int:
    from linearkit.io import save

    path = os.path.join(folder, name)
    save(model, path)
    return os.path.getsize(path)


# ---------------------------------------------------------------- the sections
def factorization(task: Task, cfg: Config) -> dict:
    """The rank sweep of a trained model, with and without a short fine-tune of the factors."""
    from linearkit.transforms import rank_sweep

    tune = {"x": task.x_train, "y": task.y_train, "steps": cfg.tune_steps, "lr": 1e-3,
            "batch_size": 100}
    sweep = rank_sweep(task.model, (task.x_test, task.y_test), ranks=list(cfg.ranks),
                       finetune=tune, repeats=cfg.repeats)
    return {"task": task.name, "table": sweep.to_markdown(), "rows": sweep.rows}


def quarter_claim(sweeps: list[dict]) -> list[dict]:
    """The claim: "a quarter of the parameters costs under one point of accuracy". For each
    sweep, the row whose parameter count is nearest a quarter of the original's."""
    out = []
    for s in sweeps:
        base, rows = s["rows"][0], s["rows"][1:]
        if not rows:
            continue
        row = min(rows, key=lambda r: abs(r["params"] / base["params"] - 0.25))
        out.append({"task": s["task"], "rank": row["rank"],
                    "params_fraction": row["params"] / base["params"],
                    "drop": base["accuracy"] - row["accuracy"],
                    "drop_tuned": base["accuracy"] - row.get("accuracy_tuned", row["accuracy"]),
                    "speedup": row["speedup"]})
    return out


def big_layer(cfg: Config) -> dict:
    """The claim: "rank 64 takes a 100 MB layer under 10 MB and runs 3x faster"."""
    from .factorize_claims import measure_factorization_claim

    return measure_factorization_claim(n=cfg.claim_n, rank=cfg.claim_rank, batch=(1, 64, 256),
                                       repeats=cfg.repeats, seed=cfg.seed)


def int8(tasks: list[Task], cfg: Config) -> list[dict]:
    """Weight-only int8 (and dynamic activations): accuracy, bytes in memory and on disk."""
    from linearkit.transforms import quantize

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for task in tasks:
            fp32_file = _file_bytes(task.model, folder, "fp32.safetensors")
            acc = _accuracy(task.model, task.x_test, task.y_test)
            for activations in (None, "dynamic"):
                q, report = quantize(task.model, "int8", activations=activations,
                                     probe=task.x_test[:256])
                rows.append({"task": task.name,
                             "mode": "weights + dynamic activations" if activations
                             else "weights only",
                             "accuracy_fp32": acc,
                             "accuracy_int8": _accuracy(q, task.x_test, task.y_test),
                             "bytes_before": report.bytes_before,
                             "bytes_after": report.bytes_after,
                             "file_before": fp32_file,
                             "file_after": _file_bytes(q, folder, "int8.safetensors"),
                             "max_rel_error": report.max_rel_error})
    return rows


def fold_and_merge(task: Task, cfg: Config) -> dict:
    """A model with a BatchNorm1d and a Linear-Dropout-Linear head, trained, then folded and
    merged: exactness, parameters, FLOPs and latency before and after."""
    from linearkit.analysis import ledger
    from linearkit.analysis.timing import same_run_seconds
    from linearkit.transforms import fold_norm, merge_linear

    rng = np.random.default_rng(cfg.seed)
    n_in, classes = task.x_train.shape[1], int(task.y_train.max()) + 1
    model, _ = _train(task, _mlp(n_in, cfg.hidden, classes, rng, norm=True), cfg.steps,
                      cfg.seed)
    folded, fold_report = fold_norm(model, probe=task.x_test)
    merged, merge_report = merge_linear(folded, probe=task.x_test)
    before, after = model(task.x_test), merged(task.x_test)
    out = {"task": task.name, "layers_before": [type(m).__name__ for m in model],
           "layers_after": [type(m).__name__ for m in merged],
           "max_abs_error": float(np.abs(after - before).max()),
           "max_rel_error": max(fold_report.max_rel_error, merge_report.max_rel_error),
           "same_predictions": float(np.mean(before.argmax(1) == after.argmax(1))),
           "accuracy_before": _accuracy(model, task.x_test, task.y_test),
           "accuracy_after": _accuracy(merged, task.x_test, task.y_test),
           "fold": fold_report.summary(), "merge": merge_report.summary()}
    for name, m in (("before", model), ("after", merged)):
        totals = ledger(m, (1, n_in), optimizer=None).totals
        out[f"params_{name}"], out[f"flops_{name}"] = totals["params"], totals["flops"]
    for batch in (1, 100):
        x = task.x_test[:batch]
        out[f"latency_{batch}"] = same_run_seconds(
            [lambda x=x: model(x), lambda x=x: folded(x), lambda x=x: merged(x)],
            repeats=cfg.repeats)  # original, folded, folded + merged
    return out


def qkv(cfg: Config) -> list[dict]:
    """The usual layout: one fused ``Linear(d, 3d)`` against three ``Linear(d, d)``."""
    from .qkv_timing import time_qkv

    return [time_qkv(d, b, repeats=cfg.repeats, seed=cfg.seed)
            for d in cfg.qkv_dims for b in cfg.qkv_batches]


def sparse_init_saves_nothing(cfg: Config) -> dict:
    """The claim: ``init.sparse_(w, sparsity=0.99)`` said to cut memory 90%."""
    from linearkit import Linear, init
    from linearkit.transforms import to_sparse

    n_in = 20 * cfg.sparse_size
    layer = Linear(n_in, 512, bias=False, rng=np.random.default_rng(cfg.seed))
    dense_before = layer.weight.data.nbytes
    init.sparse_(layer.weight, sparsity=0.99, rng=np.random.default_rng(cfg.seed))
    zeros = float(np.mean(layer.weight.data == 0))
    _, report = to_sparse(layer)
    return {"shape": (512, n_in), "zeros": zeros, "bytes_before_init": dense_before,
            "bytes_after_init": layer.weight.data.nbytes, "csr_bytes": report.bytes_after}


def sparse_speed(cfg: Config) -> list[dict]:
    from .sparse_timing import sparse_vs_dense

    n = cfg.sparse_size
    return [row for b in cfg.sparse_batches
            for row in sparse_vs_dense(n, n, b, cfg.sparsities, repeats=cfg.repeats,
                                       seed=cfg.seed)]


def pruning(task: Task, cfg: Config) -> list[dict]:
    """Magnitude pruning of a trained model (no fine-tune), stored sparse: accuracy and file."""
    from linearkit.transforms import prune, to_sparse

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        dense_file = _file_bytes(task.model, folder, "dense.safetensors")
        for amount in cfg.prune_amounts:
            pruned, _ = prune(task.model, amount, probe=task.x_test[:256])
            sparse, _ = to_sparse(pruned, min_sparsity=0.5, probe=task.x_test[:256])
            rows.append({"task": task.name, "amount": amount,
                         "accuracy": _accuracy(sparse, task.x_test, task.y_test),
                         "file_dense": dense_file,
                         "file_sparse": _file_bytes(sparse, folder, "sparse.safetensors")})
    return rows


def lora(task: Task, cfg: Config) -> dict:
    """LoRA on a task the base gets wrong (its labels permuted within two pairs of classes):
    accuracy, trainable parameters and training memory against full fine-tuning."""
    from linearkit import CrossEntropyLoss
    from linearkit.analysis import ledger
    from linearkit.optim import Adam
    from linearkit.recipes.train_mnist1d import train
    from linearkit.transforms import add_lora, merge_lora

    perm = np.arange(int(task.y_train.max()) + 1)
    perm[[0, 1, 2, 3]] = [1, 0, 3, 2]
    shifted = (task.x_train, perm[task.y_train], task.x_test, perm[task.y_test])
    n_in = task.x_train.shape[1]
    base = task.model
    out = {"task": task.name, "base_on_shifted": _accuracy(base, shifted[2], shifted[3]),
           "base_on_original": _accuracy(base, task.x_test, task.y_test)}
    adapted, _ = add_lora(base, rank=cfg.lora_rank, alpha=2 * cfg.lora_rank,
                          rng=np.random.default_rng(cfg.seed))
    runs = {"lora": adapted, "full": _copy(base).train()}
    for name, model in runs.items():
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = Adam(trainable, lr=1e-3)
        start = time.perf_counter()
        model, _ = train(model=model, dataset=shifted, steps=cfg.lora_steps, optimizer=optimizer,
                         loss_fn=CrossEntropyLoss(), seed=cfg.seed, eval_every=0)
        model.eval()
        memory = ledger(model, (100, n_in), optimizer="adam").memory
        out[name] = {"accuracy": _accuracy(model, shifted[2], shifted[3]),
                     "trainable": sum(p.size for p in trainable),
                     "total": sum(p.size for p in model.parameters()),
                     "training_state": memory["training_state"],
                     "seconds": time.perf_counter() - start}
        runs[name] = model
    merged, merge_report = merge_lora(runs["lora"], probe=shifted[2])
    out["merge_rel_error"] = merge_report.max_rel_error
    out["merged_accuracy"] = _accuracy(merged, shifted[2], shifted[3])
    out["base_unchanged"] = _base_unchanged(base, runs["lora"])
    return out


def _base_unchanged(base, adapted) -> bool:
    """Whether every tensor of ``base`` is bitwise equal to its twin in the LoRA model (a
    wrapped layer's ``<path>.weight`` lives at ``<path>.base_layer.weight``)."""
    tuned = adapted.state_dict()
    for key, value in base.state_dict().items():
        head, _, name = key.rpartition(".")
        twin = tuned.get(key, tuned.get(f"{head}.base_layer.{name}" if head else key))
        if twin is None or not np.array_equal(value, twin):
            return False
    return True


def _copy(model):
    import copy

    return copy.deepcopy(model)


def run(out_dir=DEFAULT_OUT_DIR, *, quick: bool = False, seed: int = 0,
        config: Config | None = None, write: bool = True, log=print) -> Result:
    """Train the two base models, measure every section, write the page (unless ``write`` is
    False); returns the :class:`Result`."""
    from .pages import page_command, run_page
    from .surgery_page import render_page

    cfg = config or (Config.quick(seed) if quick else Config(seed=seed))
    command = page_command("surgery", out_dir, quick=cfg.quick_run, seed=cfg.seed,
                           default_seed=0, default_out_dir=DEFAULT_OUT_DIR)
    return run_page(cfg, _measure, render_page, "surgery.md", out_dir, write, log, command)


def _measure(cfg: Config, log) -> Result:
    result = Result(cfg, machine_info())
    tasks = _datasets(cfg.seed)
    for task in tasks:
        rng = np.random.default_rng(cfg.seed)
        model = _mlp(task.x_train.shape[1], cfg.hidden, int(task.y_train.max()) + 1, rng)
        task.model, task.train_seconds = _train(task, model, cfg.steps, cfg.seed)
        result.tasks[task.name] = {
            "accuracy": _accuracy(task.model, task.x_test, task.y_test),
            "params": sum(p.size for p in task.model.parameters()),
            "seconds": task.train_seconds, "train_rows": len(task.x_train),
            "test_rows": len(task.x_test)}
        log(f"trained {task.name}: test accuracy {result.tasks[task.name]['accuracy']:.1%}")
    mnist = tasks[0]
    steps = [
        ("factorization", lambda: [factorization(t, cfg) for t in tasks]),
        ("big_layer", lambda: big_layer(cfg)),
        ("int8", lambda: int8(tasks, cfg)),
        ("fold_merge", lambda: fold_and_merge(mnist, cfg)),
        ("qkv", lambda: qkv(cfg)),
        ("sparse_init", lambda: sparse_init_saves_nothing(cfg)),
        ("sparse_speed", lambda: sparse_speed(cfg)),
        ("pruning", lambda: [row for t in tasks for row in pruning(t, cfg)]),
        ("lora", lambda: lora(mnist, cfg)),
    ]
    measure_sections(steps, result.sections, log)
    result.sections["quarter"] = quarter_claim(result.sections["factorization"])
    result.machine["load_after"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments surgery [--quick] [--out-dir DIR | --write-docs | --no-write]
    [--seed N]``; a mistake is one line on stderr and exit status 2."""
    from .pages import parse_page_args

    args, out_dir = parse_page_args(
        "surgery", "Train MLPs on MNIST-1D and digits, apply every transform (factorize, int8, "
        "fold, merge, QKV, prune/sparse, LoRA), measure them against popular claims, "
        "write the page.", "surgery.md", DEFAULT_OUT_DIR, 0, argv,
        needs=[("sklearn", "sklearn"), ("scipy", "sparse"), ("safetensors", "cli")])
    run(out_dir, quick=args.quick, seed=args.seed, write=not args.no_write)
    return 0


if __name__ == "__main__":  # python -m experiments.surgery
    raise SystemExit(main())
