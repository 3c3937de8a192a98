"""One framework, one group of cases, one process: ``python -m benchmarks.worker FRAMEWORK GROUP``.

Prints one JSON object on stdout (anything the code under test prints goes to stderr):
``{"framework", "group", "info", "results": {case: {...}}, "errors": {case: message}}``.
A framework that cannot be imported gives ``{"unavailable": reason}`` instead of results.
FRAMEWORK ``info`` prints the machine description (see ``benchmarks.machine``).

``--serve`` (benchmarks/paired.py) builds and calibrates every timed case, prints
``{"ready": [case, ...]}``, then times one repeat per request line ``{"case": case}`` on stdin
(answering ``{"s": seconds per iteration}``) until ``{"done": true}``, and prints the JSON object
above with those repeats' statistics: the parent interleaves the repeats of several frameworks'
processes, so that each framework's repeats see the same state of the machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback

from . import cases
from .timing import Prepare, calibrate, measure, repeat, run_stats, summary


class Recorder:
    """Collects one worker's measurements; an exception in one case is recorded, not fatal."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.results: dict[str, dict] = {}
        self.errors: dict[str, str] = {}

    def time(self, case: str, build, *args, train: bool = False, **meta) -> None:
        """Time ``build(*args)`` (which returns a ``prepare``) and store it under ``case``."""
        try:
            prepare: Prepare = build(*args)
            stats = measure(
                prepare,
                repeats=self.cfg["repeats"],
                min_time=self.cfg["train_min_time" if train else "min_time"],
                gc_off=not train,
            )
        except Exception as err:  # noqa: BLE001 - reported in the table as "error"
            self.fail(case, err)
            return
        self.results[case] = {**stats, **meta}

    def runs(self, case: str, once, repeats: int, steps: int) -> None:
        """Time ``repeats`` whole runs: ``once() -> seconds`` (e.g. the recipe's 6,000 steps,
        the model built untimed inside it)."""
        self.guarded(case, lambda: run_stats([once() for _ in range(repeats)], steps))

    def put(self, case: str, value: dict) -> None:
        self.results[case] = value

    def fail(self, case: str, err: BaseException) -> None:
        self.errors[case] = f"{type(err).__name__}: {err}"
        traceback.print_exception(err, file=sys.stderr)

    def guarded(self, case: str, fn, *args, **kwargs) -> None:
        """Run ``fn(*args, **kwargs) -> dict`` and store its result under ``case``."""
        try:
            self.put(case, fn(*args, **kwargs))
        except Exception as err:  # noqa: BLE001
            self.fail(case, err)


class ServingRecorder(Recorder):
    """A Recorder that builds and calibrates each timed case but times it only on request
    (``--serve``): ``serve`` answers the parent's requests, one repeat each."""

    def __init__(self, cfg: dict, warm_s: float = 0.0, warm_calls: int = 1, policy=None):
        super().__init__(cfg)
        self.cases: dict[str, tuple] = {}   # case -> (prepare, n, gc_off, meta, times)
        self.whole: dict[str, tuple] = {}   # case -> (once, steps, times): whole runs
        # untimed iterations before each repeat: at least warm_calls, for warm_s seconds at least
        self.warm_s, self.warm_calls = warm_s, warm_calls
        # policy() -> the implementation's thread policy (linearkit's): {"backoffs": how often
        # it has backed off so far, "reduced": whether it has fewer threads for a large GEMM
        # than when idle}; each case counts the backoffs during its timed repeats and the
        # repeats that started reduced
        self.policy = policy
        self.policy_counts: dict[str, dict[str, int]] = {}

    def time(self, case: str, build, *args, train: bool = False, **meta) -> None:
        try:
            prepare: Prepare = build(*args)
            n = calibrate(prepare, min_time=self.cfg["train_min_time" if train else "min_time"],
                          gc_off=not train)
        except Exception as err:  # noqa: BLE001
            self.fail(case, err)
            return
        self.cases[case] = (prepare, n, not train, meta, [])

    def runs(self, case: str, once, repeats: int, steps: int) -> None:
        self.whole[case] = (once, steps, [])

    def _one_repeat(self, case: str) -> float:
        """Time one repeat of ``case`` (one whole run of a ``runs`` case) and keep it."""
        if case in self.whole:
            once, _, times = self.whole[case]
            times.append(once())
            return times[-1]
        prepare, n, gc_off, _, times = self.cases[case]
        # untimed iterations first: the other processes ran since the last repeat
        warm_until, calls = time.perf_counter() + self.warm_s, 0
        while calls < self.warm_calls or time.perf_counter() < warm_until:
            repeat(prepare, 1, gc_off)
            calls += 1
        before = self.policy() if self.policy else None
        times.append(repeat(prepare, n, gc_off))
        if before is not None:
            counts = self.policy_counts.setdefault(case, {"timed_backoffs": 0,
                                                          "reduced_starts": 0})
            counts["timed_backoffs"] += self.policy()["backoffs"] - before["backoffs"]
            counts["reduced_starts"] += before["reduced"]
        return times[-1]

    def serve(self, requests, answer) -> None:
        """One repeat per request, until ``{"done": true}`` or the end of ``requests``."""
        answer({"ready": [*self.cases, *self.whole]})
        for line in requests:
            request = json.loads(line)
            if request.get("done"):
                break
            case = request["case"]
            try:
                answer({"s": self._one_repeat(case)})
            except Exception as err:  # noqa: BLE001
                self.fail(case, err)
                answer({"error": self.errors[case]})
        for case, (_, n, _, meta, times) in self.cases.items():
            if times and case not in self.errors:
                self.results[case] = {**summary(times, n), **meta}
                self.results[case].update(self.policy_counts.get(case, {}))
        for case, (_, steps, times) in self.whole.items():
            if times and case not in self.errors:
                self.results[case] = run_stats(times, steps)


def run(framework: str, group: str, quick: bool | str, serve=None) -> dict:
    """``serve``: ``(requests, answer)`` for ``--serve`` (see the module's docstring)."""
    out: dict = {"framework": framework, "group": group}
    if framework == "info":
        from . import machine

        out["info"] = machine.info()
        return out
    start = time.perf_counter()
    try:
        impl = importlib.import_module(f"benchmarks.impl_{framework}")
        impl.check()
    except ImportError as err:
        out["unavailable"] = f"{type(err).__name__}: {err}"
        return out
    fn = getattr(impl, group, None)
    if fn is None:
        out["unavailable"] = f"group {group!r} is not written for {framework}"
        return out
    out["info"] = impl.info()
    cfg = cases.config(quick)
    # an implementation with state that follows the machine's load (linearkit's BLAS-thread
    # policy) says how long it needs, after the other processes' turns, to see the machine idle
    smoke = quick == "smoke"
    rec = Recorder(cfg) if serve is None else ServingRecorder(
        cfg, 0.0 if smoke else getattr(impl, "SERVE_WARM_S", 0.0),
        1 if smoke else getattr(impl, "SERVE_WARM_CALLS", 1), getattr(impl, "policy_state", None))
    try:
        fn(rec)
    except Exception as err:  # noqa: BLE001 - e.g. a missing API: the whole group fails
        rec.fail("*", err)
    if serve is not None:
        rec.serve(*serve)
    out["results"], out["errors"] = rec.results, rec.errors
    out["wall_s"] = time.perf_counter() - start
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("framework", choices=("info", "numpy", "linearkit", "torch", "jax"))
    parser.add_argument("group", nargs="?", default="info", choices=("info", *cases.GROUPS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--serve", action="store_true",
                        help="time one repeat per request on stdin (benchmarks/paired.py)")
    args = parser.parse_args(argv)
    stdout, sys.stdout = sys.stdout, sys.stderr  # keep stdout for the JSON lines

    def answer(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    serve = (sys.stdin, answer) if args.serve else None
    try:
        out = run(args.framework, args.group, "smoke" if args.smoke else args.quick, serve)
    finally:
        sys.stdout = stdout
    stdout.write(json.dumps(out) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
