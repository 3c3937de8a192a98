"""Interleaved repeats: one process per framework, their repeats taken in turn.

Run one after another, two children of a group are minutes apart, and on this shared machine the
speed of the whole machine drifts by 1.5x over minutes (a NumPy case's round medians in one full
run: 18.9, 15.2, 12.3 ms): a ratio of two such medians says more about the drift than about the
frameworks. Here every framework's child is started with ``--serve`` (benchmarks/worker.py),
builds and calibrates its cases alone, and then waits; the parent asks them in turn for one
repeat of the same case, so each framework's k-th repeat lies within a second or two of the
others'. Still one framework per process and never two running at once: between two children's
turns the parent waits ``SETTLE_S``, for the last one's BLAS threads to stop spinning (OpenBLAS's
keep a core busy ~0.13 s after a GEMM, measured here).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time

SETTLE_S = 0.2


def pair_key(case: str) -> str:
    """Cases compared with each other share a key, and their repeats are taken together: the
    shape or batch after the kind (``train:32``, ``train-fused:32`` and ``gemms:32``;
    ``fwd:256x1024->4096``); the cases without one share the key ``""`` (the small group's
    ``fwd`` and ``fwdbwd``, the recipe's variants, all compared with one another)."""
    return case.split(":", 1)[1] if ":" in case else ""


class _Child:
    """A ``--serve`` worker: JSON lines to its stdin, JSON lines back, with a deadline."""

    def __init__(self, framework: str, cmd: list[str], cwd, env: dict, deadline: float):
        self.framework, self.deadline = framework, deadline
        self.started = time.perf_counter()
        # a file, not a pipe: it can never fill up; closed in close()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr)
        self.buffer = b""

    def send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self) -> dict:
        """The next JSON line; raises RuntimeError on exit, a bad line or the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = self.deadline - time.perf_counter()
            if left <= 0:
                raise RuntimeError("timed out")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"exit code {self.proc.wait()}: {self.tail()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError as err:
            raise RuntimeError(f"unreadable reply {line[:200]!r}") from err

    def tail(self) -> str:
        self.stderr.seek(0)
        return "\n".join(self.stderr.read().decode(errors="replace").strip().splitlines()[-5:])

    def close(self, grace: float = 0.0) -> None:
        """Wait up to ``grace`` seconds for the child to exit, then kill it."""
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_paired(frameworks: list[str], group: str, flags: list[str], cwd, env: dict,
               timeout: float, repeats: int) -> dict[str, dict]:
    """Each framework's worker output for ``group``, as ``run.run_child`` returns it, with the
    ``repeats`` repeats of every timed case taken in turn: for each ``pair_key``, the k-th repeat
    of each framework's cases of that key, one framework after another (the order reversed
    every other repeat), so that the k-th repeats of two compared cases lie seconds apart.
    A child that fails gets ``{"failed": reason}``; the others go on."""
    deadline = time.perf_counter() + timeout
    children: dict[str, _Child] = {}
    offered: dict[str, list[str]] = {}
    outs: dict[str, dict] = {}

    def fail(fw: str, err: Exception) -> None:
        outs[fw] = {"framework": fw, "group": group, "failed": str(err)}
        children.pop(fw).close()

    try:
        for fw in frameworks:       # one at a time: each builds and calibrates alone
            cmd = [sys.executable, "-m", "benchmarks.worker", fw, group, *flags, "--serve"]
            child = children[fw] = _Child(fw, cmd, cwd, env, deadline)
            try:
                first = child.receive()
            except RuntimeError as err:
                fail(fw, err)
                continue
            if "ready" in first:
                offered[fw] = first["ready"]
            else:                    # unavailable, or the group failed before any case
                outs[fw] = {**first, "child_s": time.perf_counter() - child.started}
                children.pop(fw).close(grace=10)
        offered_all = [c for fw in frameworks for c in offered.get(fw, [])]
        last = None
        for key in dict.fromkeys(pair_key(c) for c in offered_all):
            for r in range(repeats):
                for fw in frameworks if r % 2 == 0 else frameworks[::-1]:
                    for case in [c for c in offered.get(fw, []) if pair_key(c) == key]:
                        if fw not in children:
                            break
                        if last is not None and last != fw:
                            time.sleep(SETTLE_S)
                        last = fw
                        try:
                            children[fw].send({"case": case})
                            children[fw].receive()
                        except (RuntimeError, OSError) as err:
                            fail(fw, err)
        for fw, child in list(children.items()):
            try:
                child.send({"done": True})
                out = child.receive()
            except (RuntimeError, OSError) as err:
                fail(fw, err)
                continue
            out["child_s"] = time.perf_counter() - child.started
            out["paired"] = [f for f in frameworks if f in offered]
            outs[fw] = out
            children.pop(fw).close(grace=10)
    finally:
        for child in children.values():
            child.close()
    return outs
