"""One framework, one group of cases, one process: ``python -m benchmarks.worker FRAMEWORK GROUP``.

Prints one JSON object on stdout (anything the code under test prints goes to stderr):
``{"framework", "group", "info", "results": {case: {...}}, "errors": {case: message}}``.
A framework that cannot be imported gives ``{"unavailable": reason}`` instead of results.
FRAMEWORK ``info`` prints the machine description (see ``benchmarks.machine``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback

from . import cases
from .timing import Prepare, measure


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


def run(framework: str, group: str, quick: bool | str) -> dict:
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
    rec = Recorder(cases.config(quick))
    try:
        fn(rec)
    except Exception as err:  # noqa: BLE001 - e.g. a missing API: the whole group fails
        rec.fail("*", err)
    out["results"], out["errors"] = rec.results, rec.errors
    out["wall_s"] = time.perf_counter() - start
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("framework", choices=("info", "numpy", "linearkit", "torch", "jax"))
    parser.add_argument("group", nargs="?", default="info", choices=("info", *cases.GROUPS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    stdout, sys.stdout = sys.stdout, sys.stderr  # keep stdout for the one JSON line
    try:
        out = run(args.framework, args.group, "smoke" if args.smoke else args.quick)
    finally:
        sys.stdout = stdout
    stdout.write(json.dumps(out) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
