"""The recipe end to end, each run a fresh process: what a user waits for, start-up included.

Issue 11: "`linearkit train` (fresh process, cached kernels) faster than the same recipe in
PyTorch and in JAX including their start-up". Each framework's worker (``impl_*.e2e``) launches
its command here, once untimed (numba's kernel cache and MNIST-1D's cache filled, the files
in the OS cache), then ``repeats`` timed runs, and reports the wall time from launch to exit:

- linearkit: ``linearkit train --json --out FILE`` -- the real command (the console script's
  own two lines, ``from linearkit.cli.commands import main; main()``, run by this interpreter so that
  this checkout's linearkit is the one measured), 6,000 steps by default;
- PyTorch / JAX: ``python -m benchmarks.e2e torch|jax --data FILE.npz --out FILE`` -- the same
  recipe written with the benchmark's own model and step (``impl_torch`` / ``impl_jax``):
  import, load MNIST-1D (the same arrays, from an ``.npz`` written untimed by the launcher),
  build the 40-100-res(100)-10 model, Adam lr 1e-2, batch 100 reshuffled every epoch (last
  incomplete batch dropped), test accuracy every 500 steps and at the end, train accuracy at the
  end, weights saved. JAX compiles its step and evaluation inside the timed run.

Run as a script it prints one JSON line: accuracies, ``import_s`` and ``train_s`` (the loop).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STEPS = 6000  # `linearkit train`'s default
EVAL_EVERY = 500      # `linearkit train`'s default --eval-every
WARM_STEPS = 20       # the untimed first run: enough to compile and cache every kernel
CLI = "import sys; from linearkit.cli.commands import main; sys.exit(main())"


# ----------------------------------------------------------------------------- the launcher
def dataset_file(folder: str) -> str:
    """MNIST-1D's four arrays (``linearkit.data.mnist1d()``) as ``folder/mnist1d.npz``."""
    import numpy as np

    from linearkit.data import mnist1d

    d = mnist1d()
    path = os.path.join(folder, "mnist1d.npz")
    np.savez(path, x_train=d.x_train, y_train=d.y_train, x_test=d.x_test, y_test=d.y_test)
    return path


def linearkit_command(out: str, steps: int) -> list[str]:
    """``linearkit train --json --out OUT`` (``--steps`` only when not the default)."""
    cmd = [sys.executable, "-c", CLI, "train", "--json", "--out", out]
    return cmd if steps == DEFAULT_STEPS else cmd + ["--steps", str(steps)]


def script_command(framework: str, data: str, out: str, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.e2e", framework, "--data", data, "--out", out,
            "--steps", str(steps), *extra]


def fresh(cmd: list[str], timeout: float = 600) -> dict:
    """Run ``cmd`` in a fresh process (repository root, this checkout first on the path):
    ``{"wall_s", "report"}``, the report being its last stdout line as JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"benchmarks/e2e.py: `{' '.join(cmd[:2])} ... {' '.join(cmd[-4:])}` "
                           f"exited with {proc.returncode}: {tail}")
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"benchmarks/e2e.py: expected one JSON line on stdout from "
                           f"{cmd[:4]}, got {proc.stdout[-300:]!r}") from None
    return {"wall_s": wall, "report": report}


def timed_runs(command, repeats: int, steps: int) -> dict:
    """``command(steps)`` once untimed with ``WARM_STEPS`` steps, then ``repeats`` timed runs
    of ``command(steps)``: median wall time, every run's, and the last run's own report."""
    fresh(command(WARM_STEPS))
    runs = [fresh(command(steps)) for _ in range(max(1, repeats))]
    walls = [r["wall_s"] for r in runs]
    report = runs[-1]["report"]
    loops = [r["report"].get("train_s", r["report"].get("seconds")) for r in runs]
    # each run's own loop and rest, then their medians: the machine's speed drifts from run
    # to run, so one run's loop beside the median wall could exceed it
    known = [(w, t) for w, t in zip(walls, loops) if t is not None]
    imports = [r["report"]["import_s"] for r in runs if r["report"].get("import_s") is not None]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "repeats_s": walls,
            "steps": steps,
            "loop_s": statistics.median(t for _, t in known) if known else None,
            "rest_s": statistics.median(w - t for w, t in known) if known else None,
            "import_s": statistics.median(imports) if imports else None,
            "test_accuracy": report.get("test_accuracy"),
            "train_accuracy": report.get("train_accuracy")}


def steps_for(cfg: dict) -> int:
    """6,000 steps (the command's default) in a full run; the recipe group's count otherwise."""
    return DEFAULT_STEPS if not cfg.get("quick") else cfg["recipe_steps"]


def run_cases(rec, commands: dict, needs_data: bool = False) -> None:
    """Time each ``commands[name](data, out, steps) -> argv`` with :func:`timed_runs` into
    ``rec`` under ``name``; ``data`` is MNIST-1D as ``.npz`` when ``needs_data``, and every file
    lives in a temporary folder removed afterwards."""
    import tempfile

    steps = steps_for(rec.cfg)
    with tempfile.TemporaryDirectory(prefix="lk-e2e-") as tmp:
        data = dataset_file(tmp) if needs_data else None
        for name, make in commands.items():
            out = os.path.join(tmp, f"{name}.weights")
            rec.guarded(name, timed_runs, lambda s, make=make, out=out: make(data, out, s),
                        rec.cfg["e2e_repeats"], steps)


# ----------------------------------------------------------------------------- the scripts
def _batches(n: int, batch: int, steps: int, seed: int):
    """Index arrays of ``steps`` batches: a fresh permutation every epoch, the rest dropped."""
    import numpy as np

    gen = np.random.default_rng(seed)
    done = 0
    while done < steps:
        perm = gen.permutation(n)
        for i in range(n // batch):
            if done == steps:
                return
            yield perm[i * batch:(i + 1) * batch]
            done += 1


def run_torch(args) -> dict:
    start = time.perf_counter()
    from . import impl_torch

    impl_torch.check()
    torch = impl_torch.torch
    import_s = time.perf_counter() - start
    import numpy as np

    from . import cases

    r = cases.RECIPE
    d = np.load(args.data)
    x_train, y_train = torch.from_numpy(d["x_train"]), torch.from_numpy(d["y_train"])
    x_test, y_test = torch.from_numpy(d["x_test"]), torch.from_numpy(d["y_test"])
    model = impl_torch.build_model((x_train.shape[1], r["hidden"], r["hidden"], r["classes"]),
                                   residual=True)
    step = impl_torch.trainer(model, r["lr"], args.fused)

    def accuracy(x, y) -> float:
        model.eval()
        with torch.inference_mode():
            acc = float((model(x).argmax(1) == y).float().mean())
        model.train()
        return acc

    history = []
    loop_start = time.perf_counter()
    for i, idx in enumerate(_batches(len(x_train), r["batch"], args.steps, args.seed), 1):
        idx = torch.from_numpy(idx)
        step(x_train[idx], y_train[idx])
        if args.eval_every and (i % args.eval_every == 0 or i == args.steps):
            history.append(accuracy(x_test, y_test))
    train_s = time.perf_counter() - loop_start
    result = {"test_accuracy": accuracy(x_test, y_test),
              "train_accuracy": accuracy(x_train, y_train)}
    torch.save(model.state_dict(), args.out)
    return {"framework": "torch", "fused": args.fused, "import_s": import_s, "train_s": train_s,
            **result}


def run_jax(args) -> dict:
    start = time.perf_counter()
    from . import impl_jax

    impl_jax.check()
    jax, jnp = impl_jax.jax, impl_jax.jnp
    import_s = time.perf_counter() - start
    import numpy as np

    from . import cases

    r = cases.RECIPE
    d = np.load(args.data)
    x_train, y_train, x_test, y_test = (d[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    params = impl_jax.init((x_train.shape[1], r["hidden"], r["hidden"], r["classes"]))
    state = impl_jax.adam_state(params)
    step = impl_jax.make_step(r["lr"], residual=True)
    predict = jax.jit(lambda p, x: jnp.argmax(impl_jax.forward(p, x, True), axis=1))

    def accuracy(p, x, y) -> float:
        return float(np.mean(np.asarray(predict(p, x)) == y))

    history = []
    loop_start = time.perf_counter()
    for i, idx in enumerate(_batches(len(x_train), r["batch"], args.steps, args.seed), 1):
        params, state, _ = step(params, state, x_train[idx], y_train[idx])
        if args.eval_every and (i % args.eval_every == 0 or i == args.steps):
            history.append(accuracy(params, x_test, y_test))
    jax.block_until_ready(params)
    train_s = time.perf_counter() - loop_start
    result = {"test_accuracy": accuracy(params, x_test, y_test),
              "train_accuracy": accuracy(params, x_train, y_train)}
    np.savez(args.out, *[np.asarray(a) for pair in params for a in pair])
    return {"framework": "jax", "import_s": import_s, "train_s": train_s, **result}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e",
                                description="the `linearkit train` recipe in PyTorch or JAX, "
                                            "one fresh process (for the e2e group)")
    p.add_argument("framework", choices=("torch", "jax"))
    p.add_argument("--data", required=True, help="MNIST-1D as .npz (x_train, y_train, ...)")
    p.add_argument("--out", required=True, help="where to save the trained weights")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fused", action="store_true", help="PyTorch: Adam(fused=True)")
    args = p.parse_args(argv)
    out = (run_torch if args.framework == "torch" else run_jax)(args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
