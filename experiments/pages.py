"""What the experiments that write a docs page share: the command line of a page
(``--quick``, ``--out-dir``, ``--write-docs``, ``--no-write``, ``--seed``) and the command
line a page's header names, the repository's docs/ folder, and the machine line every page
starts with."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np

__all__ = ["machine_info", "measure_sections", "page_command", "parse_page_args", "repo_docs",
           "run_page"]


def repo_docs() -> Path | None:
    """The ``docs/`` folder of the checkout this ``experiments/`` folder sits in, or None (no
    ``pyproject.toml`` and ``docs/`` beside it)."""
    root = Path(__file__).resolve().parents[1]
    docs = root / "docs"
    return docs if (root / "pyproject.toml").is_file() and docs.is_dir() else None


def machine_info() -> dict:
    """Python, NumPy, CPU count, the 1-minute load average and the BLAS (threadpoolctl)."""
    info = {"python": platform.python_version(), "numpy": np.__version__,
            "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    try:
        from threadpoolctl import threadpool_info

        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if blas:
            info["blas"] = (f"{blas[0].get('internal_api')} {blas[0].get('version')} "
                            f"({blas[0].get('architecture')} kernel)")
    except ImportError:
        pass
    return info


def parse_page_args(name: str, description: str, page: str, default_out_dir: str,
                    default_seed: int, argv, needs=()) -> tuple:
    """Parse ``python -m experiments NAME [--quick] [--out-dir DIR | --write-docs | --no-write]
    [--seed N]``: ``(args, out_dir)``, every mistake one line on stderr and exit status 2.

    ``page``: the page's file name in docs/ ('surgery.md'); ``needs``: ``(module, extra)``
    pairs the run imports (checked up front, so a missing extra is a usage error, not a crash
    half-way).
    """
    import importlib

    from linearkit.cli.args import Parser, UsageError, check_writable_dir, int_at_least

    parser = Parser(prog=f"python -m experiments {name}", description=description)
    stem = page.rsplit(".", 1)[0]
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny smoke version (seconds); writes {stem}_quick.md")
    parser.add_argument("--out-dir", dest="out_dir", default=None, metavar="DIR",
                        help=f"folder for the page (default: {default_out_dir})")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"regenerate the repository's docs/{page} (full run, from a "
                             "source checkout)")
    parser.add_argument("--no-write", action="store_true", help="measure and print only")
    parser.add_argument("--seed", type=int_at_least(0), default=default_seed,
                        help="weights and batches")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [name]:  # called with the experiment's name still in front
        argv = argv[1:]
    args = parser.parse_args(argv)
    out_dir = default_out_dir if args.out_dir is None else args.out_dir
    try:
        if args.write_docs:
            if args.out_dir is not None or args.no_write or args.quick:
                raise UsageError("--write-docs writes the full page into the repository's "
                                 "docs/; drop --out-dir/--no-write/--quick")
            out_dir = repo_docs()
            if out_dir is None:
                raise UsageError("--write-docs needs a source checkout of linearkit; use "
                                 "--out-dir DIR")
        if not args.no_write:
            check_writable_dir(str(out_dir))
        for module, extra in needs:
            try:
                importlib.import_module(module)
            except ImportError:
                raise UsageError(f"this experiment needs {module}: pip install "
                                 f'"linearkit[{extra}]"') from None
    except UsageError as exc:
        parser.error(str(exc))
    return args, Path(out_dir)


def page_command(name: str, out_dir, *, quick: bool, seed: int, default_seed: int,
                 default_out_dir) -> str:
    """The command line that writes a page into ``out_dir``, as a user types it: ``python -m
    experiments NAME`` with ``--quick``, ``--write-docs`` (``out_dir`` is the repository's
    docs/) or ``--out-dir DIR`` (not the default), and ``--seed N`` (not the default)."""
    parts = ["python", "-m", "experiments", name] + (["--quick"] if quick else [])
    docs = repo_docs()
    if docs is not None and Path(out_dir).resolve() == docs.resolve():
        parts.append("--write-docs")
    elif Path(out_dir) != Path(default_out_dir):
        parts += ["--out-dir", str(out_dir)]
    if seed != default_seed:
        parts += ["--seed", str(seed)]
    return " ".join(parts)


def run_page(cfg, measure, render, page: str, out_dir, write: bool, log,
             command: str) -> object:
    """``measure(cfg, log)`` on ``cfg.threads`` BLAS threads (fixed, so no ratio depends on the
    adaptive policy's choice of the moment), then, unless ``write`` is False, ``render(result)``
    written to ``out_dir/page`` (``<stem>_quick.md`` for a quick config) under the header line
    that names ``command`` and the commit measured (read before measuring) and the date
    (:mod:`experiments.provenance`). Returns the result."""
    from linearkit.backend.threads import num_threads

    from .provenance import current_commit, header_line, with_header

    commit = current_commit()
    with num_threads(cfg.threads):
        result = measure(cfg, log)
    if write:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = page.rsplit(".", 1)[0]
        path = out / (f"{stem}_quick.md" if cfg.quick_run else page)
        path.write_text(with_header(render(result), header_line(command, commit)),
                        encoding="utf-8")
        log(f"wrote {path}")
    return result


def measure_sections(steps, sections: dict, log) -> None:
    """Run each ``(name, measure)`` of ``steps`` in order into ``sections[name]``, logging how
    long each took."""
    import time

    for name, measure in steps:
        start = time.perf_counter()
        sections[name] = measure()
        log(f"{name}: {time.perf_counter() - start:.1f} s")
