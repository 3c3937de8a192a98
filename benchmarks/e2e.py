"""The recipe end to end, each run a fresh process: what a user waits for, start-up included.

The target: "`linearkit train` (fresh process, cached kernels) faster than the same recipe in
PyTorch and in JAX including their start-up". Each framework's worker (``impl_*.e2e``) launches
its command here, once untimed (numba's kernel cache and MNIST-1D's cache filled, the files
in the OS cache), then ``repeats`` timed runs, and reports the wall time from launch to exit.
linearkit's runs are also taken cold, each beside a warm one: ``NUMBA_CACHE_DIR`` (numba's
own setting, which takes precedence over the cache beside the package) pointed at a new, empty
temporary folder, so that the run compiles every kernel it uses, as the first run after an
install does. PyTorch keeps nothing between runs and JAX compiles in every run (its persistent
compilation cache is off unless configured, which the script reports), so their warm runs are
their cold ones. A process that a run leaves behind (on a cold cache, linearkit compiles its
kernels in a detached background process) is waited for before the next run starts, and is not
in the run's wall time: the user does not wait for it.

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
# set to a token unique to each launched run: the processes that inherit it are that run's
RUN_ENV = "BENCHMARKS_E2E_RUN"


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


def fresh(cmd: list[str], timeout: float = 600, env_extra: dict | None = None) -> dict:
    """Run ``cmd`` in a fresh process (repository root, this checkout first on the path,
    ``env_extra`` added to the environment): ``{"wall_s", "report", "after_s"}``, the report
    being its last stdout line as JSON. ``after_s``: how long processes it left behind (a
    background compiler, which inherits its environment) ran on after it exited; they are
    waited for, up to ``timeout``, so that they slow no later run, and are not in ``wall_s``."""
    token = f"{os.getpid()}-{time.perf_counter_ns()}"
    env = {**os.environ, **(env_extra or {}), RUN_ENV: token}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - start
    after = wait_for_leftovers(token, timeout)
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
    return {"wall_s": wall, "report": report, "after_s": after}


def _carriers(token: str) -> list[int]:
    """The processes whose environment holds ``RUN_ENV=token`` (none where /proc is missing)."""
    needle = f"{RUN_ENV}={token}".encode()
    found = []
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    for pid in entries:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:                 # gone, or not ours
            continue
    return found


def wait_for_leftovers(token: str, timeout: float) -> float:
    """Seconds until no process started under ``token`` (see :func:`fresh`) is left, at most
    ``timeout``."""
    start = time.perf_counter()
    while _carriers(token) and time.perf_counter() - start < timeout:
        time.sleep(0.05)
    return time.perf_counter() - start


def cold(cmd: list[str]) -> dict:
    """:func:`fresh` with ``NUMBA_CACHE_DIR`` at a new empty folder, removed afterwards; adds
    ``cache_files``, how many numba cache files (``.nbi`` index, ``.nbc`` data) were there
    once the run and what it left behind had finished (none: nothing compiled into it, so the
    run was not the cold run it was meant to be)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lk-e2e-numba-") as cache:
        got = fresh(cmd, env_extra={"NUMBA_CACHE_DIR": cache})
        got["cache_files"] = sum(f.endswith((".nbi", ".nbc"))
                                 for _, _, files in os.walk(cache) for f in files)
    return got


def timed_runs(command, repeats: int, steps: int, cold_too: bool = False) -> dict:
    """``command(steps)`` once untimed with ``WARM_STEPS`` steps (and whatever it left running,
    ``warm_up_after_s``: a background compile that fills the cache), then ``repeats`` timed runs
    of ``command(steps)``: median wall time, every run's, and the last run's own report. With
    ``cold_too`` each timed run follows a :func:`cold` one, whose statistics are under
    ``"cold"`` (and ``cold_over_warm``: the median of each cold run's wall over the warm run's
    beside it)."""
    warm_up = fresh(command(WARM_STEPS))
    runs, colds = [], []
    for _ in range(max(1, repeats)):
        if cold_too:
            colds.append(cold(command(steps)))
        runs.append(fresh(command(steps)))
    out = {**run_summary(runs, steps), "warm_up_after_s": warm_up["after_s"]}
    if cold_too:
        out["cold"] = {**run_summary(colds, steps),
                       "cache_files": [r["cache_files"] for r in colds]}
        out["cold_over_warm"] = statistics.median(c["wall_s"] / w["wall_s"]
                                                  for c, w in zip(colds, runs))
    return out


def run_summary(runs: list[dict], steps: int) -> dict:
    """Medians over :func:`fresh` results: wall, training loop, the rest, framework import."""
    walls = [r["wall_s"] for r in runs]
    report = runs[-1]["report"]
    loops = [r["report"].get("train_s", r["report"].get("seconds")) for r in runs]
    # each run's own loop and rest, then their medians: the machine's speed drifts from run
    # to run, so one run's loop beside the median wall could exceed it
    known = [(w, t) for w, t in zip(walls, loops) if t is not None]
    imports = [r["report"]["import_s"] for r in runs if r["report"].get("import_s") is not None]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "repeats_s": walls,
            "steps": steps, "after_s": [r["after_s"] for r in runs],
            "loop_s": statistics.median(t for _, t in known) if known else None,
            "rest_s": statistics.median(w - t for w, t in known) if known else None,
            "import_s": statistics.median(imports) if imports else None,
            "test_accuracy": report.get("test_accuracy"),
            "train_accuracy": report.get("train_accuracy"),
            **({"compilation_cache": report["compilation_cache"]}
               if "compilation_cache" in report else {})}


def steps_for(cfg: dict) -> int:
    """6,000 steps (the command's default) in a full run; the recipe group's count otherwise."""
    return DEFAULT_STEPS if not cfg.get("quick") else cfg["recipe_steps"]


def run_cases(rec, commands: dict, needs_data: bool = False, cold_too: bool = False) -> None:
    """Time each ``commands[name](data, out, steps) -> argv`` with :func:`timed_runs` into
    ``rec`` under ``name`` (and, with ``cold_too``, its cold runs under ``name-cold``); ``data``
    is MNIST-1D as ``.npz`` when ``needs_data``, and every file lives in a temporary folder
    removed afterwards."""
    import tempfile

    steps = steps_for(rec.cfg)
    with tempfile.TemporaryDirectory(prefix="lk-e2e-") as tmp:
        data = dataset_file(tmp) if needs_data else None
        for name, make in commands.items():
            out = os.path.join(tmp, f"{name}.weights")
            rec.guarded(name, timed_runs, lambda s, make=make, out=out: make(data, out, s),
                        rec.cfg["e2e_repeats"], steps, cold_too)
            if cold_too and "cold" in rec.results.get(name, {}):
                rec.put(f"{name}-cold", rec.results[name].pop("cold"))


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
    # None: JAX's persistent compilation cache is off, and the run compiled everything itself
    cache = getattr(jax.config, "jax_compilation_cache_dir", None)
    return {"framework": "jax", "import_s": import_s, "train_s": train_s,
            "compilation_cache": cache, **result}


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
