"""The parent: ``python -m benchmarks [--quick] [--only GROUP] [--forced-kernel [CORETYPE]]
[--write-docs] [--save FILE] [--from-json FILE]``.

Runs each (framework, group) in its own child process, one after another, with
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` removed from the children's environment (the
parent's own environment is left as it is); prints the tables and the targets of issue 3.
``--forced-kernel`` reruns the BLAS-bound groups for NumPy and linearkit with those variables as
the parent has them (or ``OPENBLAS_CORETYPE=CORETYPE`` when given) and reports them too.
``--write-docs`` regenerates ``docs/performance.md`` from the measured results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import cases, report
from .machine import BLAS_ENV

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "performance.md"
FRAMEWORK_MODULE = {"numpy": "numpy", "linearkit": "linearkit", "torch": "torch", "jax": "jax"}


THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def child_env(forced: dict | None, threads: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
    if forced:
        env.update(forced)
    if threads:
        env.update({k: str(threads) for k in THREAD_ENV})
        if threads == 1:  # XLA's CPU backend: no Eigen thread pool for its ops
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def run_child(framework: str, group: str, quick: bool | str, env: dict, timeout: float) -> dict:
    flag = {"smoke": ["--smoke"], True: ["--quick"]}.get(quick, [])
    cmd = [sys.executable, "-m", "benchmarks.worker", framework, group, *flag]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"framework": framework, "group": group,
                "failed": f"timed out after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return {"framework": framework, "group": group,
                "failed": f"exit code {proc.returncode}: {tail}"}
    out["child_s"] = time.perf_counter() - start
    return out


def merge_rounds(outs: list[dict]) -> dict:
    """One worker output from several rounds: for each case, the round with the lowest median.

    On a shared machine a burst of load can slow one whole child process many times over
    (a BLAS thread waiting for a core); the least disturbed round is the better estimate.
    Every round's median is kept under ``round_medians_s``.
    """
    if len(outs) == 1:
        return outs[0]
    merged = json.loads(json.dumps(outs[0]))
    merged["rounds"] = len(outs)
    merged["child_s"] = sum(o.get("child_s", 0.0) for o in outs)
    results = merged.setdefault("results", {})
    cases_seen = {c for o in outs for c in o.get("results", {})}
    for case in cases_seen:
        found = [o["results"][case] for o in outs
                 if case in o.get("results", {}) and "median_s" in o["results"][case]]
        if not found:
            continue
        best = dict(min(found, key=lambda r: r["median_s"]))
        best["round_medians_s"] = [r["median_s"] for r in found]
        results[case] = best
    for o in outs[1:]:
        for case, err in o.get("errors", {}).items():
            if case not in results:
                merged.setdefault("errors", {})[case] = err
    for case in list(merged.get("errors", {})):
        if case in results:
            del merged["errors"][case]
    return merged


def available(framework: str) -> bool:
    return importlib.util.find_spec(FRAMEWORK_MODULE[framework]) is not None


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="linearkit vs bare NumPy, PyTorch eager and JAX jit; each framework in its "
                    "own process. Groups: " + "; ".join(f"{g}: {h}" for g, h in
                                                        cases.GROUP_HELP.items()))
    p.add_argument("--quick", action="store_true",
                   help="fewer repeats and a 1,000-step recipe (~2 minutes)")
    p.add_argument("--only", action="append", default=[], metavar="GROUP",
                   help="run only these groups (repeatable or comma-separated)")
    p.add_argument("--frameworks", default=None,
                   help="comma-separated subset of numpy,linearkit,torch,jax")
    p.add_argument("--forced-kernel", nargs="?", const="", default=None, metavar="CORETYPE",
                   help="also run NumPy and linearkit with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE as "
                        "set in this environment (or OPENBLAS_CORETYPE=CORETYPE)")
    p.add_argument("--write-docs", action="store_true",
                   help=f"regenerate {DOCS.relative_to(ROOT)} from the results")
    p.add_argument("--save", metavar="FILE", help="write the raw results as JSON")
    p.add_argument("--from-json", metavar="FILE",
                   help="report (and --write-docs) from saved results instead of measuring")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="run the timed groups R times, alternating the frameworks' order, and "
                        "keep each case's least disturbed round (for a busy machine)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="set OMP/OPENBLAS/MKL_NUM_THREADS=N in the children (default: the "
                        "libraries' own choice, i.e. every core)")
    p.add_argument("--smoke", action="store_true",
                   help="run every case once, to test the harness (numbers are meaningless)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per child process")
    p.add_argument("--list", action="store_true", help="list the groups and exit")
    return p.parse_args(argv)


def selected_groups(only: list[str]) -> list[str]:
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in cases.GROUPS]
    if unknown:
        raise SystemExit(f"unknown group(s) {unknown}; choose from {list(cases.GROUPS)}")
    return names or list(cases.GROUPS)


def forced_settings(value: str | None) -> dict | None:
    if value is None:
        return None
    forced = {k: os.environ[k] for k in BLAS_ENV if os.environ.get(k)}
    if value:
        forced["OPENBLAS_CORETYPE"] = value
    return forced


def measure_all(args) -> dict:
    groups = selected_groups(args.only)
    quick = "smoke" if args.smoke else args.quick
    wanted = set(args.frameworks.split(",")) if args.frameworks else None
    forced = forced_settings(args.forced_kernel)
    started = time.perf_counter()
    results: dict = {
        "meta": {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "argv": ["python", "-m", "benchmarks", *sys.argv[1:]],
            "quick": quick, "groups": groups, "config": cases.config(quick),
            "threads": args.threads, "rounds": args.rounds,
            "parent_blas_env": {k: os.environ.get(k) for k in BLAS_ENV},
            "forced": forced, "load_before": list(os.getloadavg()),
        },
        "runs": {},
    }
    if args.forced_kernel is not None and not forced:
        results["meta"]["forced_note"] = ("--forced-kernel: neither OPENBLAS_CORETYPE nor "
                                          "OPENBLAS_L2_SIZE is set here, and no CORETYPE was "
                                          "given; nothing to force")
        print(results["meta"]["forced_note"], file=sys.stderr)
    passes = [("clean", child_env(None, args.threads), None)]
    if forced:
        passes.append(("forced", child_env(forced, args.threads), cases.BLAS_FRAMEWORKS))
    for name, env, only_fw in passes:
        run: dict = {"info": run_child("info", "info", quick, env, 60).get("info", {})}
        print(f"[{name}] {report.machine_line(run['info'])}", file=sys.stderr)
        for group in groups:
            if name == "forced" and group not in cases.BLAS_GROUPS:
                continue
            fws = [fw for fw in cases.GROUPS[group]
                   if not (only_fw and fw not in only_fw) and not (wanted and fw not in wanted)]
            rounds = args.rounds if group in cases.BLAS_GROUPS else 1
            outs: dict[str, list] = {}
            for r in range(rounds):
                for fw in (fws if r % 2 == 0 else fws[::-1]):
                    if not available(fw):
                        outs[fw] = [{"framework": fw, "group": group,
                                     "unavailable": f"{FRAMEWORK_MODULE[fw]} is not installed"}]
                        continue
                    tag = f" (round {r + 1}/{rounds})" if rounds > 1 else ""
                    print(f"[{name}] {group:9s} {fw:9s}{tag} ...", end="", file=sys.stderr,
                          flush=True)
                    out = run_child(fw, group, quick, env, args.timeout)
                    errors = len(out.get("errors", {})) + ("failed" in out)
                    print(f" {out.get('child_s', 0):6.1f} s"
                          f"{f'  ({errors} error(s))' if errors else ''}", file=sys.stderr)
                    outs.setdefault(fw, []).append(out)
            for fw in fws:
                if fw in outs:
                    run.setdefault(group, {})[fw] = merge_rounds(outs[fw])
        results["runs"][name] = run
    results["meta"]["wall_s"] = time.perf_counter() - started
    results["meta"]["load_after"] = list(os.getloadavg())
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for group, text in cases.GROUP_HELP.items():
            print(f"{group:10s} {text}  [{', '.join(cases.GROUPS[group])}]")
        return 0
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
        results.setdefault("meta", {})["rendered_from"] = args.from_json
    else:
        results = measure_all(args)
    if args.save:
        Path(args.save).write_text(json.dumps(results, indent=1))
    print(report.render_text(results))
    if args.write_docs:
        DOCS.parent.mkdir(exist_ok=True)
        DOCS.write_text(report.render_markdown(results))
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    return 0
