"""Data-parallel scaling on this machine, and a ring all-reduce model of a cluster.

``python -m benchmarks.scaling`` runs two MPI jobs, ``mpirun -n 1`` and ``mpirun -n 2`` of this
module's worker (``--worker``), each training two models data-parallel at several *global*
batch sizes (strong scaling: the global batch is split across the ranks, as
``linearkit train --ranks N`` does):

* ``recipe``: the MNIST-1D residual MLP (40-100-100-10, 15,210 parameters) on MNIST-1D;
* ``mlp784``: a 784-256-256-10 MLP (269,322 parameters) on random 784-feature rows.

Adam, float32, one BLAS thread per rank (so N ranks use N cores). Per point it prints samples
per second, the efficiency ``samples/s(N) / (N · samples/s(1))``, the gradient bytes each rank
all-reduces per step, and the time per step spent in the all-reduce (including waiting for the
slower rank). Beside it, the ring all-reduce model for N ranks on a network of
``--bandwidth-gbps`` and ``--latency-us``::

    t_comm(N) = 2(N-1)/N · bytes / bandwidth + 2(N-1) · latency
    t_step(N) = t_step(1) / N + t_comm(N)          (the compute divides perfectly)

so a user can read off how many ranks a model and batch size can use before communication
dominates. The machine has few cores and is shared: treat the measured numbers as this
machine's, and the model as the sizing tool.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = {"recipe": (40, 100, 10), "mlp784": (784, 256, 10)}
DEFAULT_BATCHES = {"recipe": [100, 400, 1600], "mlp784": [64, 256, 1024]}


def _model(case: str):
    import linearkit as lk
    from linearkit.recipes.train_mnist1d import build_model

    rng = np.random.default_rng(0)
    if case == "recipe":
        return build_model("mlp", rng=rng)
    n_in, hidden, n_out = CASES[case]
    return lk.Sequential(lk.Linear(n_in, hidden, rng=rng), lk.ReLU(),
                         lk.Linear(hidden, hidden, rng=rng), lk.ReLU(),
                         lk.Linear(hidden, n_out, rng=rng))


def _data(case: str, rows: int):
    if case == "recipe":
        from linearkit.data import mnist1d

        d = mnist1d()
        return d.x_train, d.y_train
    rng = np.random.default_rng(1)
    return (rng.standard_normal((rows, CASES[case][0])).astype(np.float32),
            rng.integers(0, CASES[case][2], rows))


# ---------------------------------------------------------------------- the worker (a rank)
def _measure(case: str, batch: int, seconds: float, repeats: int, overlap: bool,
             bucket_bytes: int) -> dict:
    import linearkit as lk
    from linearkit import distributed as D
    from linearkit.data import DataLoader

    n = D.world_size()
    model = _model(case)
    opt = lk.optim.Adam(model.parameters(), lr=1e-3)
    reducer = D.GradientReducer(model, overlap=overlap, bucket_bytes=bucket_bytes)
    x, y = _data(case, max(4 * batch, 4096))
    loader = DataLoader(x, y, batch_size=batch, shuffle=True, drop_last=True, seed=0)
    loss_fn = lk.CrossEntropyLoss()
    comm = {"s": 0.0}
    synchronize = reducer.synchronize

    def timed(loss=None):
        t = time.perf_counter()
        out = synchronize(loss)
        comm["s"] += time.perf_counter() - t
        return out

    reducer.synchronize = timed

    def run(steps: int) -> float:
        done = 0
        D.barrier()
        start = time.perf_counter()
        while done < steps:
            for xb, yb in loader:
                xs, ys = D.shard_batch(xb, yb)
                D.step(model, loss_fn, opt, xs, ys, reducer=reducer)
                done += 1
                if done == steps:
                    break
        D.barrier()
        return time.perf_counter() - start

    run(10)  # warm-up: numba's first compile, MPI's first connections
    per_step = run(20) / 20
    steps = np.array([max(20, int(seconds / max(per_step, 1e-6)))], np.int64)
    steps = int(D.allreduce_(steps, "max")[0])  # every rank runs the same count
    times, comms = [], []
    for _ in range(repeats):
        comm["s"] = 0.0
        times.append(run(steps))
        comms.append(comm["s"])
    best = int(np.argmin(times))
    return {"case": case, "batch": batch, "ranks": n, "steps": steps,
            "step_s": times[best] / steps, "comm_s": comms[best] / steps,
            "samples_per_s": batch * steps / times[best],
            "bytes_per_step": reducer.bytes_per_step if n > 1 else 0,
            "params": sum(p.size for p in model.parameters())}


def worker(args) -> None:
    from linearkit import distributed as D

    rows = []
    with D.abort_on_error():
        for case, batches in _batches(args).items():
            for batch in batches:
                rows.append(_measure(case, batch, args.seconds, args.repeats, args.overlap,
                                     int(args.bucket_mb * 2**20)))
    if D.rank() == 0:
        with open(args.worker, "w") as f:
            json.dump(rows, f)


# ---------------------------------------------------------------------- the parent
def ring_seconds(n: int, nbytes: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce time of ``nbytes`` over ``n`` ranks: ``2(n-1)/n·bytes/bw + 2(n-1)·lat``
    (``bandwidth`` in bytes/s, ``latency`` in s)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def _batches(args) -> dict:
    return {case: list(map(int, getattr(args, f"{case}_batches").split(",")))
            for case in CASES}


def _run_job(ranks: int, args) -> list[dict]:
    from linearkit.distributed.launch import mpirun_command, rank_environment

    env = rank_environment(ranks)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # one core per rank, for the 1-rank baseline too
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        command = [sys.executable, "-m", "benchmarks.scaling", "--worker", out,
                   "--seconds", str(args.seconds), "--repeats", str(args.repeats),
                   "--recipe-batches", args.recipe_batches,
                   "--mlp784-batches", args.mlp784_batches, "--bucket-mb", str(args.bucket_mb)]
        if args.overlap:
            command.append("--overlap")
        done = subprocess.run(mpirun_command(ranks, command), env=env, cwd=root, check=False)
        if done.returncode:
            raise SystemExit(f"benchmarks.scaling: the {ranks}-rank job failed "
                             f"(exit status {done.returncode})")
        with open(out) as f:
            return json.load(f)


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def report(one: list[dict], two: list[dict], args) -> tuple[str, list[dict]]:
    bw, lat = args.bandwidth_gbps * 1e9 / 8, args.latency_us * 1e-6
    model_ranks = [int(n) for n in args.model_ranks.split(",")]
    lines = ["measured on this machine (1 BLAS thread per rank; shared memory between ranks)"
             + (", overlap on" if args.overlap else ""),
             (f"{'case':<8} {'batch':>6} {'1 rank':>12} {'2 ranks':>12} {'efficiency':>10} "
             f"{'all-reduced/step':>17} {'comm/step':>10}")]
    records = []
    for a, b in zip(one, two):
        eff = b["samples_per_s"] / (2 * a["samples_per_s"])
        lines.append(f"{a['case']:<8} {a['batch']:>6} {a['samples_per_s']:>10,.0f}/s "
                     f"{b['samples_per_s']:>10,.0f}/s {eff:>10.0%} "
                     f"{_human(b['bytes_per_step']):>17} {b['comm_s'] * 1e3:>8.3f}ms")
        records.append({"case": a["case"], "batch": a["batch"], "params": a["params"],
                        "one": a, "two": b, "efficiency": eff, "model": {}})
    lines += ["", (f"ring all-reduce model: {args.bandwidth_gbps:g} Gbit/s, {args.latency_us:g} µs "
              "latency; t_step(N) = t_step(1)/N + 2(N-1)/N·bytes/bw + 2(N-1)·lat"),
              f"{'case':<8} {'batch':>6} " + " ".join(f"{f'N={n}':>20}" for n in model_ranks)]
    for rec in records:
        t1, nbytes = rec["one"]["step_s"], rec["two"]["bytes_per_step"]
        cells = []
        for n in model_ranks:
            step = t1 / n + ring_seconds(n, nbytes, bw, lat)
            sps, eff = rec["batch"] / step, t1 / (n * step)
            rec["model"][n] = {"samples_per_s": sps, "efficiency": eff}
            cells.append(f"{sps:>11,.0f}/s {eff:>5.0%}")
        lines.append(f"{rec['case']:<8} {rec['batch']:>6} " + " ".join(f"{c:>20}" for c in cells))
    lines += [("(model cells: samples/s and efficiency; N=2 beside the measured 2-rank row "
              "above, which ran over shared memory, not that network)")]
    return "\n".join(lines), records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe-batches", default=",".join(map(str, DEFAULT_BATCHES["recipe"])),
                        help="global batch sizes of the MNIST-1D recipe (even numbers)")
    parser.add_argument("--mlp784-batches", default=",".join(map(str, DEFAULT_BATCHES["mlp784"])),
                        help="global batch sizes of the 784-256-256-10 MLP (even numbers)")
    parser.add_argument("--seconds", type=float, default=0.4,
                        help="seconds per timed repeat (the step count follows)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best counts")
    parser.add_argument("--bandwidth-gbps", type=float, default=10.0,
                        help="the modelled network's bandwidth in Gbit/s (default 10)")
    parser.add_argument("--latency-us", type=float, default=5.0,
                        help="the modelled network's latency per message in µs (default 5)")
    parser.add_argument("--model-ranks", default="2,4,8,16,64",
                        help="rank counts of the model, e.g. 2,4,8")
    parser.add_argument("--overlap", action="store_true",
                        help="GradientReducer(overlap=True): buckets start during the backward")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="GradientReducer bucket size in MiB (default 25, as DDP)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for case, batches in _batches(args).items():
        if any(b < 2 or b % 2 for b in batches):
            parser.error(f"--{case}-batches: every global batch must be even (split over 2 "
                         f"ranks), got {batches}")
    if args.worker:
        worker(args)
        return 0
    load = [os.getloadavg()[0]]
    one, two = _run_job(1, args), _run_job(2, args)
    load.append(os.getloadavg()[0])
    text, records = report(one, two, args)
    if args.json:
        print(json.dumps({"bandwidth_gbps": args.bandwidth_gbps, "latency_us": args.latency_us,
                          "overlap": args.overlap, "cores": os.cpu_count(), "load": load,
                          "rows": records}))
    else:
        print(f"cores: {os.cpu_count()}, load average {load[0]:.1f} before / {load[1]:.1f} "
              "after (other processes share the cores); python -m benchmarks.scaling "
              + " ".join(argv if argv is not None else sys.argv[1:]))
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
