"""The ``linearkit`` command: ``train`` (the main job), ``ledger``, ``inspect``, ``convert``,
``compress``, ``gradcheck``, ``sweep``. (The experiments that write docs pages are repository
tooling, not commands: ``python -m experiments`` from a checkout.)

Every argument is checked before any work starts. Exit status: 0 success; 1 a failed check
(``gradcheck``) or an internal error; 2 a user error, or a file or the machine refusing (an
``OSError`` such as a full disk or a denied permission, a ``MemoryError``), always ONE line on
stderr naming the file and the fix, never a traceback; 130 interrupted (Ctrl-C; no partial file
is left, and a file already completely written when the interrupt came is reported as written);
141 stdout closed early (``linearkit ... | head -1``: the rest of the output is dropped quietly,
as a tool killed by SIGPIPE would). An internal error (a bug in linearkit, not a mistake in the
command) prints its traceback and a last line saying it is a bug, with status 1.

Text that comes from a file (tensor names, metadata, module names, messages quoting them) is
printed through ``terminal_safe``: a control character in a file reaches the terminal escaped
(``\\x1b``), so a file cannot clear the screen or rewrite a line. ``--json`` output is escaped
by JSON itself.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import stat
import sys

from ..errors import AllocationError, DTypeError, FormatError, ShapeError
from .args import (
    ParagraphHelp,
    Parser,
    UsageError,
    check_writable_file,
    fraction,
    int_at_least,
    positive_float,
    shape,
    storage_dtype,
    threads,
)

#: One line on stderr, exit status 2: mistakes in what the user asked for.
USER_ERRORS = (UsageError, ShapeError, DTypeError, FormatError)


class _Interrupted(Exception):
    """Ctrl-C came when part of the work was already done: ``message`` says what (one line on
    stderr), ``code`` is the exit status (130 only when something was left undone)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.message, self.code = message, code


def terminal_safe(text, keep_newlines: bool = False) -> str:
    """``analysis.render.terminal_safe``, imported when first needed: importing
    ``linearkit.analysis`` (the ledger, the stats) would slow every command's start."""
    from ..analysis.render import terminal_safe as escape

    return escape(text, keep_newlines)


def _say(text="") -> None:
    """``print`` for text that may hold names or values read from a file (see the module
    docstring): control characters escaped, the lines kept."""
    print(terminal_safe(text, keep_newlines=True))


def _file_identity(path: str):
    """What tells a file from the one that replaces it (device, inode, size, mtime), or None
    when ``path`` is no file: the atomic writer renames a complete file over it, so a change
    means a complete new file is in place."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _replacing(command: str, path: str, when: str) -> None:
    """Say on stderr, in one line, that ``path`` exists and will be replaced (as train does)."""
    if os.path.exists(path):
        print(terminal_safe(f"linearkit {command}: {path} exists and will be replaced {when}"),
              file=sys.stderr)


def _input_file(path: str, flag: str = "") -> str:
    """``path`` is a regular file to read: else a one-line UsageError (a FIFO or a device is
    refused here, before anything opens it, as the reader itself also does)."""
    where = f"{flag} {path}" if flag else path
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{where}: cannot be read ({exc.strerror}); check the path and its "
                         "permissions") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"{where} is a folder; give a file")
    if not stat.S_ISREG(mode):
        raise UsageError(f"{where} is not a regular file (a FIFO, device or socket); give a "
                         "file")
    return path


def _json_safe(value):
    """``value`` with every non-finite float as None (JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a NumPy scalar
        return _json_safe(value.item())
    return value


def _print_json(record) -> None:
    print(json.dumps(_json_safe(record), default=str, allow_nan=False))


def _need_cli_extra(command: str) -> None:
    """Fail up front when the ``cli`` extra is missing (``train`` must save .safetensors)."""
    try:
        import safetensors.numpy  # noqa: F401
    except ImportError:
        raise UsageError(f"linearkit {command} saves .safetensors and needs the cli extra: "
                         f'pip install "linearkit[cli]"') from None


@contextlib.contextmanager
def _ctrl_c_between_steps(progress):
    """Ctrl-C during training stops it at the end of the current step (KeyboardInterrupt raised
    from the progress callback), never in the middle of a library call: an interrupt landing
    inside tqdm's lock or a BLAS call could otherwise leave a lock held and the process hung. A
    second Ctrl-C interrupts at once. Yields the per-step callback to pass to ``train``."""
    import signal
    import threading

    pressed = threading.Event()

    def on_sigint(signum, frame):
        pressed.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second press: at once

    def each_step(step, loss, test_acc):
        if pressed.is_set():
            raise KeyboardInterrupt
        if progress is not None:
            progress(step, loss, test_acc)

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread (an embedding caller): interrupts as before
        yield each_step
        return
    try:
        yield each_step
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed.is_set():
        raise KeyboardInterrupt  # pressed after the last step: still an interrupted run


def _ranks(args: argparse.Namespace) -> tuple[int, bool]:
    """``(ranks, inside)``: how many data-parallel ranks ``train`` runs on, and whether this
    process already is one of them (started by mpirun) rather than the one that launches them."""
    from ..distributed import comm as mpi

    if mpi.launched():
        try:
            size = mpi.world_size()
        except ImportError as exc:
            raise UsageError(str(exc)) from None
        if args.ranks is not None and args.ranks != size:
            raise UsageError(f"argument --ranks: {args.ranks}, but this process runs in an MPI "
                             f"job of {size} rank(s); drop --ranks, or start mpirun -n "
                             f"{args.ranks}")
        return size, size > 1
    return (1 if args.ranks is None else args.ranks), False


def _launch_ranks(args: argparse.Namespace, ranks: int, out: str) -> int:
    """Relaunch this ``linearkit train`` under ``mpirun -n ranks``; its exit status."""
    from ..distributed import is_available
    from ..distributed.launch import find_mpirun, run_ranks

    if not is_available():
        raise UsageError('argument --ranks: needs mpi4py: pip install "linearkit[mpi]"')
    try:
        find_mpirun()
    except FileNotFoundError as exc:
        raise UsageError(f"argument --ranks: {exc}") from None
    argv = ["train"]
    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if key == "flush_denormal" and value is False:   # on by default: say it is off
            argv.append("--no-flush-denormal")
        if key in ("run", "command") or value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, str(value)]
    argv[argv.index("--ranks") + 1] = str(ranks)
    argv += [] if args.out else ["--out", out]
    before = _file_identity(out)
    try:
        code = run_ranks(ranks, [sys.executable, "-m", "linearkit.cli", *argv])
    except KeyboardInterrupt:  # a run_ranks that raises it: the job's status is unknown
        code = None
    if code is None or getattr(code, "interrupted", False):
        # run_ranks has waited for mpirun to end. Status 0: every rank finished, rank 0 had
        # saved and printed its report, so the run is complete. Else: rank 0 saves after the
        # last step, renaming a complete file over OUT, so a changed OUT means training and
        # saving had completed; what can still have been cut is rank 0's report.
        if code == 0:
            print(terminal_safe(f"linearkit train: interrupted as the {ranks}-rank job ended, "
                                f"after it had completed; the weights are saved to {out}"),
                  file=sys.stderr)
            return 0
        if _file_identity(out) not in (None, before):
            raise _Interrupted(
                f"linearkit train: interrupted as the {ranks}-rank job was ending: the weights "
                f"had been saved to {out} (the file is complete); rank 0's report above may be "
                "cut short", 130) from None
        raise KeyboardInterrupt  # nothing complete: main says so, status 130
    if code == 2:  # a rank's one-line user or machine error (a full disk), printed above
        return 2
    if code:
        print(f"linearkit train: error: the {ranks}-rank job failed (mpirun exit status {code}); "
              "the failing rank's message is above", file=sys.stderr)
        return 1
    return 0


def _rank_is_zero() -> bool:
    from ..distributed import rank

    return rank() == 0


def _abort_job_on_error(inside: bool, args: argparse.Namespace | None = None):
    """In a rank of a ``--ranks`` job, an error ends the whole job with ``rank R: message``
    (``linearkit.distributed.abort_on_error``); elsewhere nothing changes. A user error, an
    OSError (a full disk) or a MemoryError is the one line the single-process command prints
    (no traceback) and the job ends with status 2, as that command would."""
    if not inside:
        return contextlib.nullcontext()
    from ..distributed import abort_on_error

    command = f"linearkit {getattr(args, 'command', None) or 'train'}"
    return abort_on_error(describe=lambda exc: _error_line(command, exc, args))


def _train(args: argparse.Namespace) -> int:
    from ..data import mnist1d
    from ..io import save
    from ..recipes.train_mnist1d import train
    from .first_run import compiled_in_background

    _need_cli_extra("train")
    out = args.out or f"runs/mnist1d-{args.model}.safetensors"
    check_writable_file(out)
    if args.warmup is not None and args.warmup >= args.steps:
        raise UsageError(f"argument --warmup: {args.warmup} warm-up steps leave none of the "
                         f"{args.steps:,} steps for the schedule; use --warmup "
                         f"{args.steps - 1} or less, or raise --steps")
    ranks, inside = _ranks(args)
    if args.hidden is not None and args.model == "linear" and not inside:
        # said once, by the launching process; the run goes on (the width has nothing to set)
        print("linearkit train: --hidden is ignored for --model linear (logistic regression "
              "has no hidden layer)", file=sys.stderr)
    data = mnist1d()
    rows = len(data.x_train)
    if args.batch_size > rows:
        raise UsageError(f"argument --batch-size: {args.batch_size} is more than the {rows:,} "
                         f"training rows (the last incomplete batch is dropped, so no batch "
                         f"would ever come); use --batch-size {rows} or less")
    if args.batch_size % ranks:
        fit = args.batch_size - args.batch_size % ranks or ranks
        raise UsageError(f"argument --batch-size: {args.batch_size} is the global batch, split "
                         f"across the {ranks} ranks, and must be a multiple of {ranks}; use "
                         f"--batch-size {fit}")
    if ranks > 1 and not inside:
        return _launch_ranks(args, ranks, out)
    lead = not inside or _rank_is_zero()
    if os.path.exists(out) and lead:
        print(terminal_safe(f"linearkit train: {out} exists and will be replaced when training "
                            "ends (Ctrl-C now keeps it)"), file=sys.stderr)

    bar = None
    progress = None
    if not args.json and lead:
        try:
            from tqdm import tqdm
        except ImportError:  # the cli extra brings tqdm; without it, print every eval
            tqdm = None
        if inside:  # mpirun forwards a rank's output line by line: print every eval instead
            tqdm = None
        if tqdm is not None:    # its ETA restarts after the first step (cli/progress.py)
            from .progress import step_bar

            bar, progress = step_bar(args.steps)
        else:
            def progress(step, loss, test_acc):
                if test_acc is not None:
                    print(f"step {step:>6}  loss {loss:.4f}  test accuracy {test_acc:.1%}")

    # a cold numba cache: train on the NumPy path, compile in the background (cli/first_run.py)
    first_run = contextlib.nullcontext(False) if inside else compiled_in_background(args, data)
    try:
        with _abort_job_on_error(inside, args), _ctrl_c_between_steps(progress) as each_step, \
                first_run as compiling:
            model, result = train(args.model, hidden=args.hidden, steps=args.steps, lr=args.lr,
                                  batch_size=args.batch_size, seed=args.seed,
                                  eval_every=args.eval_every, progress=each_step, dataset=data,
                                  threads=args.threads, precision=args.precision,
                                  distributed=inside, flush_denormal=args.flush_denormal,
                                  schedule=args.schedule, warmup=args.warmup)
    finally:
        if bar is not None:
            bar.leave = not sys.exc_info()[0]  # interrupted: clear the bar, keep one line
            bar.close()
    if not lead:
        return 0  # rank 0 saves and reports
    recipe = {k: v for k, v in vars(args).items() if k != "run"}
    before = _file_identity(out)
    try:
        with _abort_job_on_error(inside, args):
            save(model, out, metadata={"linearkit.recipe": json.dumps(recipe, default=str)})
    except KeyboardInterrupt:
        if _file_identity(out) in (None, before):
            raise  # before the rename: the old file (if any) is kept, the temp file removed
        raise _saved_then_interrupted(out, reported=False) from None
    reported = False
    try:
        _report_training(args, model, result, out, compiling=compiling)
        sys.stdout.flush()
        reported = True
    except KeyboardInterrupt:
        raise _saved_then_interrupted(out, reported) from None
    return 0


def _saved_then_interrupted(out: str, reported: bool) -> _Interrupted:
    """Ctrl-C after the weights were completely written: say so; 130 only when the report
    (the summary, or the --json record) was left unprinted."""
    if reported:
        return _Interrupted(f"linearkit train: interrupted after the run had completed; the "
                            f"weights are saved to {out}", 0)
    return _Interrupted(f"linearkit train: interrupted after the weights were saved to {out} "
                        "(the file is complete); the report on stdout was cut short", 130)


def _report_training(args: argparse.Namespace, model, result, out: str, *,
                     compiling: bool = False) -> None:
    """What ``train`` prints once the weights are saved: the --json record, or the summary.
    ``compiling``: the run was on the NumPy path while the kernels compiled in the background."""
    from ..recipes.train_mnist1d import PAPER_ACCURACY

    if args.json:
        record = {k: v for k, v in result.to_dict().items() if k != "history"}
        record["out"] = out
        record["flush_denormal"] = args.flush_denormal
        record["kernels_compiling_in_background"] = compiling
        _print_json(record)
        return
    print(model)
    print(f"parameters: {result.params:,}")
    print(f"trained {result.steps:,} steps in {result.seconds:.2f} s "
          f"({result.steps / max(result.seconds, 1e-9):,.0f} steps/s); final loss {result.final_loss:.4f}")
    if result.precision != "fp32":
        from ..recipes.train_mnist1d import PRECISIONS

        scaler = (f"; the loss scaler skipped {result.skipped_steps} step(s)"
                  if result.precision == "fp16" else "")
        print(f"precision: {result.precision} (weights stored as {PRECISIONS[result.precision]}, "
              f"float32 compute and master weights{scaler})")
    if result.ranks > 1:
        print(f"data-parallel: {result.ranks} MPI ranks, {args.batch_size // result.ranks} rows "
              f"each of the global batch {args.batch_size}")
    if compiling:
        print("kernels: this first run trained on the NumPy path (the LINEARKIT_FAST=0 bits) "
              "while numba compiles the kernels in the background; later runs use them "
              "(docs/fast.md, \"The first run\")")
    print(f"train accuracy: {result.train_accuracy:.1%}")
    print(f"test accuracy:  {result.test_accuracy:.1%}")
    print("paper (Greydanus 2020, MNIST-1D): logistic regression "
          f"{PAPER_ACCURACY['linear']:.0%}, MLP {PAPER_ACCURACY['mlp']:.0%}  "
          f"<- this run: {args.model} {result.test_accuracy:.1%}")
    _say(f"weights saved to {out}")


def _check_safetensors_file(path: str) -> None:
    """A file given to ``ledger`` must look like safetensors: an 8-byte little-endian header
    length, then that many bytes of JSON starting with ``{``."""
    from ..storage.safetensors_header import open_regular

    f, info = open_regular(path)  # a FIFO or a device is refused, never waited on or read
    size = info.st_size
    with f:
        head = f.read(9)
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if len(head) < 9 or not 2 <= n <= size - 8 or head[8:9] != b"{":
        raise UsageError(f"{path} is not a .safetensors file (no safetensors header); give a "
                         f"file written by linearkit.save or linearkit train, or a preset")


def _shape_from_file(path: str) -> tuple | None:
    """``(1, in_features)`` of the first layer of the architecture ``path`` stores, said in one
    line on stderr; None (nothing said) when the file stores no architecture or its first layer
    does not give its width. A file the reader refuses is left to the command to report."""
    from ..analysis.inspect_file import first_layer_width

    try:
        width = first_layer_width(path)
    except (FormatError, OSError, ValueError, KeyError, TypeError):
        return None
    if width is None:
        return None
    print(terminal_safe(f"input shape (1, {width}) taken from the file's first layer; give "
                        "--input-shape to change it"), file=sys.stderr)
    return (1, width)


def _ledger(args: argparse.Namespace) -> int:
    from ..analysis.ledger import PRESETS, ledger

    if os.path.isdir(args.model):
        raise UsageError(f"{args.model} is a folder; give a .safetensors file or a preset "
                         f"({', '.join(PRESETS)})")
    if os.path.exists(args.model) and not os.path.isfile(args.model):
        _input_file(args.model)  # a FIFO, device or socket: one line, never opened
    if os.path.isfile(args.model):
        _need_cli_extra("ledger FILE")
        _check_safetensors_file(args.model)
    elif args.model not in PRESETS:
        raise UsageError(f"{args.model!r} is neither a file nor a preset name "
                         f"({', '.join(PRESETS)})")
    shape_ = args.input_shape
    if shape_ is None and args.model in PRESETS:
        shape_ = PRESETS[args.model][1]
    elif shape_ is None:  # a file: the width its first layer takes, when it says
        shape_ = _shape_from_file(args.model)
    optimizer = None if args.optimizer == "none" else args.optimizer
    try:
        report = ledger(args.model, shape_, optimizer=optimizer, dtype=args.dtype)
    except USER_ERRORS:
        raise
    except (KeyError, FileNotFoundError, ValueError) as exc:  # the ledger's checks of the input
        raise UsageError(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:
        if type(exc).__module__.startswith("safetensors"):  # passed the header check, then broke
            raise UsageError(f"{args.model} could not be read as .safetensors: {exc}") from None
        raise
    if args.json:
        _print_json(report.to_dict())
    elif args.markdown:
        _say(report.to_markdown())
    else:
        _say(report)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from ..analysis.doctor import DoctorUsageError, run

    if args.html is not None:
        check_writable_file(args.html, "--html")
    try:
        return run(args)
    except (DoctorUsageError, ImportError) as exc:
        raise UsageError(str(exc)) from None


def _explain(args: argparse.Namespace) -> int:
    from ..analysis.explain_error.cli import run

    return run(args)


def _inspect(args: argparse.Namespace) -> int:
    from ..analysis.inspect_file import describe_file, not_safetensors, render

    if os.path.isdir(args.file):  # a folder: say which model files it holds
        raise UsageError(not_safetensors(args.file))
    _input_file(args.file)  # linearkit's own reader: no extra needed to inspect
    other = not_safetensors(args.file)  # an ONNX or PyTorch file: which command reads it
    if other is not None:
        raise UsageError(other)
    info = describe_file(args.file)
    if args.json:
        _print_json(info)  # JSON escapes every control character itself
    else:
        _say(render(_escaped_file_info(info)))
    return 0


def _escaped_keys(mapping: dict, escape) -> dict:
    """``mapping`` with its keys escaped; two keys that escape alike (a control character and
    its escape written out) are shown as their reprs, so neither hides the other."""
    shown = [escape(k) for k in mapping]
    return {(repr(k) if shown.count(e) > 1 else e): v
            for (k, v), e in zip(mapping.items(), shown)}


def _escaped_file_info(info: dict) -> dict:
    """``describe_file``'s result with every string read from the file escaped for a terminal:
    names and keys on one line each (a newline in a tensor name cannot fake a row), metadata
    values and the architecture keeping their lines (``render`` indents them)."""
    safe = dict(info)
    safe["file"] = terminal_safe(info["file"])
    safe["tensors"] = [dict(t, name=terminal_safe(t["name"])) for t in info["tensors"]]
    safe["metadata"] = _escaped_keys(
        {k: terminal_safe(v, keep_newlines=True) for k, v in info["metadata"].items()},
        terminal_safe)
    if info.get("architecture") is not None:
        safe["architecture"] = terminal_safe(info["architecture"], keep_newlines=True)
    return safe


def _convert(args: argparse.Namespace) -> int:
    from ..io.convert import convert

    _need_cli_extra("convert")
    _input_file(args.source)
    check_writable_file(args.target)
    if os.path.abspath(args.source) != os.path.abspath(args.target):  # else convert refuses
        _replacing("convert", args.target, "once the conversion succeeds (Ctrl-C or an error "
                   "keeps it)")
    input_shape = args.input_shape
    if input_shape is None and args.target.lower().endswith(".onnx") \
            and args.source.lower().endswith(".safetensors"):
        input_shape = _shape_from_file(args.source)  # an export needs one: the file's own
    try:
        convert(args.source, args.target, input_shape=input_shape)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    _say(f"wrote {args.target}")
    return 0


def _compress(args: argparse.Namespace) -> int:
    import numpy as np

    from ..io.convert import load_any
    from ..transforms.pipeline import compress

    _need_cli_extra("compress")
    for path in [args.source] + ([args.arch] if args.arch else []) + (
            [args.probe] if args.probe else []):
        _input_file(path)
    if not args.out.lower().endswith(".safetensors"):
        raise UsageError(f"-o {args.out}: compress writes a self-describing .safetensors model "
                         "file; convert it afterwards (linearkit convert) if you need another")
    if os.path.abspath(args.out) == os.path.abspath(args.source):
        raise UsageError(f"-o {args.out} is the input file; give another output path")
    check_writable_file(args.out, "-o")
    _replacing("compress", args.out, "once compressing succeeds (Ctrl-C or an error keeps it)")
    probe = None
    if args.probe:
        try:
            probe = np.load(args.probe, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--probe {args.probe}: not a .npy array ({exc})") from None
    if args.max_drop is not None and not (math.isfinite(args.max_drop) and args.max_drop >= 0):
        raise UsageError(f"argument --max-drop: expected a number >= 0 (accuracy points, or "
                         f"percent of the MSE), got {args.max_drop}; e.g. --max-drop 1.0")
    if args.max_drop is not None and args.data is None:
        raise UsageError("argument --max-drop: needs held-out data to measure against; add "
                         "--data mnist1d or --data X.npy Y.npy")
    data = None
    if args.data is not None:
        if args.data == ["mnist1d"]:
            from ..data import mnist1d

            test = mnist1d()
            data = (test.x_test, test.y_test)
        elif len(args.data) == 2:
            for path in args.data:
                _input_file(path, "--data")
            try:
                data = tuple(np.load(path, allow_pickle=False) for path in args.data)
            except (OSError, ValueError) as exc:
                raise UsageError(f"--data {' '.join(args.data)}: expected two .npy arrays, "
                                 f"inputs X (N, ...) and labels or targets Y (N, ...) ({exc})"
                                 ) from None
        else:
            raise UsageError(f"argument --data: expected 'mnist1d' or two .npy files X.npy "
                             f"Y.npy; got {' '.join(args.data)!r}")
    from ..transforms.budget import CostlyTransformError

    try:
        model = load_any(args.source, args.arch)
        if args.fold:
            model.eval()  # compressing is for inference: BatchNorm folds with running stats
        model, reports = compress(model, merge=args.merge, fold=args.fold, rank=args.rank,
                                  energy=args.energy, int8=args.int8, prune=args.prune,
                                  probe=probe, data=data, max_drop=args.max_drop,
                                  force=args.force)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    except CostlyTransformError as exc:
        raise UsageError(exc.cli_message()) from None
    except (ValueError, TypeError) as exc:
        if isinstance(exc, USER_ERRORS):
            raise
        raise UsageError(f"{args.source}: {' '.join(str(exc).split())}") from None
    from ..io import save

    save(model, args.out)
    for report in reports:
        _say(report)
    if data is not None:  # the explored trade-off and what was kept
        _say(reports.table())
        _say(reports.choice())
    _say(f"wrote {args.out}: {os.path.getsize(args.source):,} -> "
         f"{os.path.getsize(args.out):,} bytes on disk")
    return 0


def _gradcheck(args: argparse.Namespace) -> int:
    from ..analysis.selfcheck import self_check

    _, failed = self_check(print)
    return 1 if failed else 0


def _size_list(text: str) -> list[int]:
    """``--batches`` / ``--dims``: distinct comma-separated integers >= 1, like 1,2,4,8."""
    pieces = text.split(",")
    bad = [q for q in pieces if not q.strip().isdigit() or int(q) < 1]
    if bad:
        reason = ("a piece is empty" if any(not q.strip() for q in bad)
                  else f"{bad[0].strip()!r} is not an integer >= 1")
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, like "
                                          f"1,2,4,8; got {text!r}: {reason}")
    values = [int(q) for q in pieces]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"a value is repeated in {text!r}; give each once")
    return values


def _sweep(args: argparse.Namespace) -> int:
    import numpy as np

    from ..analysis.layer_sweep import SweepTooLarge, batch_sweep, dim_sweep, powers_of_two

    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot {args.plot}: the plot is a PNG; name a file ending in .png")
        check_writable_file(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            from ..analysis.layer_sweep_plot import MISSING

            raise UsageError(MISSING) from None
    if args.dims is not None and args.batches is not None:
        raise UsageError("--dims compares widths at one --batch; --batches is for the batch "
                         "sweep: give one of them")
    threads_ = args.threads if isinstance(args.threads, int) else None
    dtype = np.dtype(args.dtype)
    try:
        if args.dims is not None:
            result = dim_sweep(args.dims, args.batch, dtype=dtype, backward=args.backward,
                               repeats=args.repeats, threads=threads_)
        else:
            batches = args.batches or powers_of_two(args.max_batch)
            result = batch_sweep(args.in_features, args.out_features, batches, dtype=dtype,
                                 backward=args.backward, repeats=args.repeats, threads=threads_)
    except ImportError as exc:  # --threads N without threadpoolctl
        raise UsageError(str(exc)) from None
    except SweepTooLarge as exc:  # checked before any array is allocated
        flags = ("--dims or --batch" if args.dims is not None
                 else "--in-features, --out-features or --max-batch/--batches")
        raise UsageError(f"{exc} (use smaller {flags})") from None
    if args.plot is not None:
        from ..analysis.layer_sweep_plot import plot_sweep

        plot_sweep(result, args.plot)
    if args.json:
        record = result.to_dict()
        record["plot"] = args.plot
        _print_json(record)
        return 0
    print(result.table())
    if args.plot is not None:
        _say(f"plot written to {args.plot}")
    return 0


#: What ``python -m experiments NAME`` runs from a source checkout. The experiments are
#: repository tooling, not in the installed package, so this command cannot import their
#: registry (``experiments.EXPERIMENTS``); tests/test_cli.py checks that the two lists agree.
REPOSITORY_EXPERIMENTS = ("init-depth", "precision", "surgery")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = Parser(prog="linearkit",
                    description="linearkit's command line: train the MNIST-1D baselines, the "
                                "ledger of a model, a self-check.",
                    formatter_class=ParagraphHelp,
                    epilog="experiments: the runs behind the docs pages are repository tooling, "
                           "not commands (from a source checkout; they are not installed): "
                           "python -m experiments NAME, NAME one of "
                           f"{', '.join(REPOSITORY_EXPERIMENTS)}; python -m experiments NAME "
                           "--help for its options.\n\n"
                           "exit status: 0 ok, 1 failed check or internal error, 2 usage error, "
                           "130 interrupted")
    parser.add_argument("--version", action="version", version=f"linearkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser(
        "train", help="train an MNIST-1D baseline (the paper's MLP by default)",
        description="Train an MNIST-1D baseline of Greydanus (2020) and save its weights.")
    train.add_argument("--model", choices=["mlp", "linear"], default="mlp",
                       help="the residual MLP or logistic regression")
    # default None, not 100: _train must tell an explicit --hidden (ignored by --model
    # linear) from the default; the recipe builds 100 wide when it is None
    train.add_argument("--hidden", type=int_at_least(1), default=None,
                       help="hidden width of the MLP (default: 100)")
    train.add_argument("--steps", type=int_at_least(1), default=6000, help="optimizer steps")
    train.add_argument("--lr", type=positive_float, default=1e-2, help="Adam learning rate")
    train.add_argument("--batch-size", type=int_at_least(1), default=100,
                       help="rows per step, at most the 4,000 training rows")
    train.add_argument("--seed", type=int_at_least(0), default=42,
                       help="seeds the weights and the batch order")
    train.add_argument("--eval-every", type=int_at_least(0), default=500,
                       help="evaluate every N steps (0: only at the end)")
    train.add_argument("--schedule", choices=["constant", "cosine", "onecycle"],
                       default="constant",
                       help="learning-rate schedule over the steps: constant, cosine decay to "
                            "0, or onecycle (OneCycleLR up to --lr and down); each after "
                            "--warmup steps rising linearly (onecycle: its own rise)")
    train.add_argument("--warmup", type=int_at_least(0), default=None,
                       help="warm-up steps, fewer than --steps (default 0; onecycle: 30%% of "
                            "the steps)")
    train.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                       help="parameter storage: float32, or bfloat16/float16 with float32 "
                            "compute and master weights (fp16 also scales the loss)")
    train.add_argument("--threads", type=threads, default="auto",
                       help="BLAS threads: a number >= 1 (linearkit.set_num_threads), or auto "
                            "(also 'default') for linearkit's policy: 1 thread for small GEMMs "
                            "and on a busy machine (docs/threads.md)")
    train.add_argument("--ranks", type=int_at_least(1), default=None,
                       help="data-parallel over N MPI ranks: relaunches itself under mpirun -n "
                            "N (the mpi extra); --batch-size stays the global batch, split "
                            "across the ranks; rank 0 saves and reports (docs/distributed.md)")
    train.add_argument("--flush-denormal", action=argparse.BooleanOptionalAction, default=True,
                       help="treat subnormal floats as zero while training, as JAX does "
                            "(linearkit.set_flush_denormal; faster once ReLU units die, same "
                            "accuracy here); --no-flush-denormal computes them exactly, as "
                            "PyTorch does")
    train.add_argument("--out", default=None,
                       help="where to save the weights (.safetensors); default: "
                            "runs/mnist1d-MODEL.safetensors")
    train.add_argument("--json", action="store_true",
                       help="no progress bar; print one JSON object with the results")
    train.set_defaults(run=_train)

    ledger = commands.add_parser(
        "ledger", help="parameters, FLOPs, memory and redundant structure of a model, per layer",
        description="Per-layer parameters, MACs, FLOPs, training memory and redundant "
                    "structure of a preset or a .safetensors file.")
    ledger.add_argument("model", help="a .safetensors file or a preset: mlp-mnist, mnist1d, "
                                      "linear-4096, linear-512-256, linear-1024-4096")
    ledger.add_argument("--input-shape", type=shape, default=None,
                        help="input shape with batch, e.g. 64,784 (default: the preset's)")
    ledger.add_argument("--optimizer", default="adam",
                        choices=["adam", "adamw", "sgd", "sgd-momentum", "none"],
                        help="whose states count towards training memory")
    ledger.add_argument("--dtype", type=storage_dtype, default=None,
                        help="storage dtype, e.g. float16 (default: the model's)")
    output = ledger.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="print a markdown table")
    output.add_argument("--json", action="store_true", help="print one JSON object")
    ledger.set_defaults(run=_ledger)

    inspect = commands.add_parser(
        "inspect", help="tensors, metadata, architecture and size of a .safetensors file",
        description="What a .safetensors file holds: tensors (dtype, shape, bytes), metadata, "
                    "the architecture when stored, and the ledger's parameter/memory summary.")
    inspect.add_argument("file", help="a .safetensors file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=_inspect)

    convert = commands.add_parser(
        "convert", help="convert between .safetensors, .pt/.pth and .onnx",
        description="Convert a model file: .safetensors <-> .pt/.pth (state dicts; torch "
                    "needed), .safetensors (with architecture) <-> .onnx.")
    convert.add_argument("source", help="the file to read")
    convert.add_argument("target", help="the file to write (its extension picks the format)")
    convert.add_argument("--input-shape", type=shape, default=None,
                         help="input shape with batch for an ONNX export, e.g. 1,40")
    convert.set_defaults(run=_convert)

    squeeze = commands.add_parser(
        "compress", help="merge, fold, factorize, prune or int8-quantize a model file",
        description="Shrink a model file with linearkit.transforms, each step checked on probe "
                    "inputs (its report is printed): --fold, then --merge, then --rank/--energy, "
                    "then --prune (stored sparse), then --int8. Writes .safetensors. With --data "
                    "and --max-drop it searches for the smallest model within the budget; "
                    "without --data a step changing the outputs by more than 10% is refused "
                    "unless --force.")
    squeeze.add_argument("source", help="a linearkit .safetensors model file, an ONNX MLP, or "
                                        "a .pt/.pth state dict (with --arch)")
    squeeze.add_argument("-o", "--out", required=True, help="the .safetensors file to write")
    squeeze.add_argument("--arch", default=None,
                         help="for a .pt/.pth input: a linearkit model file of the same layers")
    squeeze.add_argument("--merge", action="store_true",
                         help="merge consecutive linear layers with nothing nonlinear between")
    squeeze.add_argument("--fold", action="store_true",
                         help="fold BatchNorm1d/LayerNorm affine maps into the Linear layers")
    low_rank = squeeze.add_mutually_exclusive_group()
    low_rank.add_argument("--rank", type=int_at_least(1), default=None,
                          help="factorize each Linear at this rank (where it saves)")
    low_rank.add_argument("--energy", type=fraction(True, False), default=None,
                          help="factorize keeping this fraction of spectral energy, e.g. 0.9")
    squeeze.add_argument("--int8", action="store_true",
                         help="weight-only int8 per output channel")
    squeeze.add_argument("--prune", type=fraction(False, True), default=None, metavar="AMOUNT",
                         help="zero this fraction of each weight (smallest magnitudes) and "
                              "store the layers sparse")
    squeeze.add_argument("--probe", default=None,
                         help="a .npy batch of real inputs to check the result on")
    squeeze.add_argument("--data", nargs="+", default=None, metavar="mnist1d|X.npy Y.npy",
                         help="held-out data to measure accuracy (integer labels) or MSE "
                              "(float targets) on: 'mnist1d' (its test split) or two .npy files")
    squeeze.add_argument("--max-drop", type=float, default=None, metavar="POINTS",
                         help="with --data: search the lossy steps (those given, else a "
                              "default grid) and keep the smallest model within this many "
                              "accuracy points (or percent of the MSE) of the original")
    squeeze.add_argument("--force", action="store_true",
                         help="without --data, write a result whose outputs change by more "
                              "than 10%% on the probes (refused otherwise)")
    squeeze.set_defaults(run=_compress)

    doctor = commands.add_parser(
        "doctor", help="cost, health, precision, correctness and runtime of a model, per layer",
        description="Ask a model the three questions (what goes in and out of each layer, what "
                    "it costs, which linear structure is redundant), then check its health on "
                    "one batch, its readiness for a 16-bit dtype, its gradients and its route "
                    "(docs/doctor.md).")
    doctor.add_argument("file", nargs="?", default=None,
                        help="a .safetensors (linearkit.save) or .onnx model, or a .pt/.pth with "
                             "--arch")
    doctor.add_argument("--arch", default=None,
                        help="for a .pt/.pth file: a linearkit model file of the same layers")
    doctor.add_argument("--torch", default=None, metavar="MODULE:ATTR",
                        help="a torch nn.Module, or a class/function building one, instead of "
                             "FILE")
    doctor.add_argument("--data", default=None,
                        help="mnist1d, X.npy, X.npy,Y.npy or an .npz with x (and y) (default: a "
                             "random probe)")
    doctor.add_argument("--input-shape", type=shape, default=None,
                        help="the random probe's shape with batch, e.g. 64,40")
    doctor.add_argument("--precision", choices=["bfloat16", "float16"], default=None,
                        help="check readiness for this 16-bit dtype")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument("--html", default=None, metavar="FILE.html",
                        help="also write the self-contained HTML report")
    doctor.set_defaults(run=_doctor)

    explain = commands.add_parser(
        "explain", help="explain an error message: the cause, the layer, the fix",
        description="Explain an error message from PyTorch or linearkit: its real cause and, "
                    "given the model (and input shape), which layer it is and the one-line fix "
                    "(docs/explain.md). Exit 0 when recognized, 1 when not.")
    explain.add_argument("message", help="the error message, or - to read it (a traceback) from "
                                         "stdin")
    explain.add_argument("--model", default=None, help="a linearkit model file")
    explain.add_argument("--input-shape", type=shape, default=None,
                         help="the input's shape with batch, e.g. 16,512")
    explain.set_defaults(run=_explain)

    check = commands.add_parser(
        "gradcheck", help="self-check: every shipped module's backward vs central differences",
        description="Every shipped module's backward against float64 central differences.")
    check.set_defaults(run=_gradcheck)

    sweep = commands.add_parser(
        "sweep", help="throughput and latency of a Linear against batch size, or across widths",
        description="Time Linear(IN, OUT) forward (and with --backward forward+backward) at "
                    "batch sizes 1, 2, 4, ... --max-batch: latency (ms per call), throughput "
                    "(samples/s) and the knee (the smallest batch reaching 90% of the best "
                    "throughput). With --dims, time square layers Linear(d, d) of those widths "
                    "at one --batch instead (e.g. 250,256,1000,1024), each width that is not a "
                    "multiple of 64 beside the nearest swept one (250 -> 256, 1000 -> 1024).")
    sweep.add_argument("--in-features", type=int_at_least(1), default=1024,
                       help="the layer's input width")
    sweep.add_argument("--out-features", type=int_at_least(1), default=1024,
                       help="the layer's output width")
    sweep.add_argument("--dtype", choices=["float32", "float64", "float16"], default="float32",
                       help="the layer's and the input's dtype")
    batches = sweep.add_mutually_exclusive_group()
    batches.add_argument("--max-batch", type=int_at_least(1), default=256,
                         help="sweep the powers of two up to this batch")
    batches.add_argument("--batches", type=_size_list, default=None,
                         help="the batch sizes to sweep instead, e.g. 1,8,32,100")
    sweep.add_argument("--dims", type=_size_list, default=None,
                       help="compare square layers of these widths at --batch instead of "
                            "sweeping the batch, e.g. 250,256,1000,1024")
    sweep.add_argument("--batch", type=int_at_least(1), default=64,
                       help="the batch size of the --dims comparison")
    sweep.add_argument("--backward", action="store_true",
                       help="also time forward+backward (zero_grad, vjp, backward)")
    sweep.add_argument("--repeats", type=int_at_least(1), default=7,
                       help="timed samples per point (the median is shown)")
    sweep.add_argument("--threads", type=threads, default="auto",
                       help="BLAS threads: a number >= 1, or auto (also 'default') for "
                            "linearkit's policy (docs/threads.md)")
    sweep.add_argument("--plot", default=None, metavar="FILE.png",
                       help="also draw the sweep into this PNG (needs matplotlib)")
    sweep.add_argument("--json", action="store_true", help="print one JSON object")
    sweep.set_defaults(run=_sweep)
    return parser


def _stdout_closed() -> int:
    """The reader of stdout went away: drop the rest of the output quietly (exit 141)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit flush cannot raise again
    except (OSError, ValueError):
        pass
    return 141


_OS_FIXES = {  # errno -> what to do, for the one line an OSError becomes
    errno.ENOSPC: "free some space on that filesystem, or write somewhere else",
    getattr(errno, "EDQUOT", -1): "your disk quota is used up: free some space, or write "
                                  "somewhere else",
    errno.EACCES: "check the permissions of the file and of its folder, or use another path",
    errno.EPERM: "check the permissions of the file and of its folder, or use another path",
    errno.EROFS: "that filesystem is read-only: write somewhere writable",
    errno.ENOENT: "check that the path exists (was its folder removed or renamed meanwhile?)",
    errno.EISDIR: "a folder is in the way: name a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EFBIG: "the file is too large for that filesystem: write to another one",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or close other programs",
    errno.ENFILE: "too many open files on this machine: close other programs",
    errno.EIO: "the device reported an I/O error: check the disk",
}


def _outputs(args) -> list[str]:
    """The files this command writes (train's default --out included)."""
    if args is None:
        return []
    paths = [getattr(args, name, None) for name in ("out", "target", "plot")]
    if getattr(args, "command", None) == "train" and not args.out:
        paths.append(f"runs/mnist1d-{args.model}.safetensors")
    return [os.path.abspath(p) for p in paths if isinstance(p, str)]


def _os_error_line(exc: OSError, args) -> str:
    """An OSError as one line: the file (when known), what was being done, the system's reason
    and the fix; for an output, that the previous file is unchanged (writes are atomic)."""
    reason = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    code = errno.errorcode.get(exc.errno) if exc.errno is not None else None
    got = f"{reason} ({code})" if code else reason
    fix = _OS_FIXES.get(exc.errno, "check the path and the device, then run the command again")
    name = exc.filename
    if name is None:
        return f"{got}; {fix}"
    name = os.fsdecode(name) if isinstance(name, bytes) else str(name)
    full = os.path.abspath(name)
    writing = any(out == full or out.startswith(full.rstrip(os.sep) + os.sep)
                  for out in _outputs(args))
    if writing:  # the writes are atomic: the old file is whole, or there was none
        kept = ("the file there is unchanged" if os.path.isfile(full)
                else "no file was created")
        return f"cannot write {name}: {got}; {kept} and no partial file is left; {fix}"
    return f"{name}: {got}; {fix}"


def _error_line(command: str, exc: BaseException, args) -> str | None:
    """The one line (escaped for a terminal) a user error, an OSError or a MemoryError becomes,
    exit status 2: what ``main`` prints, and a rank of a ``--ranks`` job too; None for any
    other exception (a bug: its traceback is shown)."""
    if isinstance(exc, USER_ERRORS):
        kind = "" if isinstance(exc, UsageError) else f"{type(exc).__name__}: "
        message = " ".join(str(exc).replace("\n  hint: ", " -- hint: ").split())
        return terminal_safe(f"{command}: error: {kind}{message}")
    if isinstance(exc, OSError):
        return terminal_safe(f"{command}: error: {_os_error_line(exc, args)}")
    if isinstance(exc, AllocationError):  # names the layer, its array, shape, dtype, bytes
        message = " ".join(str(exc).split())
        return terminal_safe(f"{command}: error: AllocationError: {message}; no output file "
                             "was replaced")
    if isinstance(exc, MemoryError):
        detail = " ".join(str(exc).split())
        return terminal_safe(f"{command}: error: out of memory"
                             f"{f' ({detail})' if detail else ''}: the work asked for does not "
                             "fit in this machine's memory; no output file was replaced; use "
                             "smaller sizes or close other programs")
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``linearkit ARGV``; returns the exit status (see the module docstring)."""
    parser = build_parser()
    command = "linearkit"
    args = code = None
    try:
        args = parser.parse_args(argv)
        command = f"linearkit {args.command}"
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe surfaces here, not at exit
        return code
    except KeyboardInterrupt:
        if code is not None:  # the command had returned: the interrupt stopped nothing of it
            print(f"{command}: interrupted after the command had completed", file=sys.stderr)
            return code
        print(f"{command}: interrupted; partial results were discarded", file=sys.stderr)
        return 130
    except _Interrupted as exc:
        print(terminal_safe(exc.message), file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return _stdout_closed()
    except (*USER_ERRORS, OSError, MemoryError) as exc:  # a mistake, the disk, the memory:
        print(_error_line(command, exc, args), file=sys.stderr)  # not a bug in linearkit
        return 2
    except Exception:
        import traceback

        # escaped too: the exception's message may quote a name read from a file
        sys.stderr.write(terminal_safe(traceback.format_exc(), keep_newlines=True))
        print(f"{command}: internal error: this is a bug in linearkit; please report it with "
              f"the command line and the traceback above", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
