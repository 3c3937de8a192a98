"""``run(args)``: ``linearkit doctor`` on parsed command-line arguments.

The arguments (``argparse.Namespace`` attributes; the ``linearkit`` command defines the flags):

* ``file`` — a model file: ``.safetensors`` written by ``linearkit.save`` (or ``linearkit
  train``), ``.onnx``, or a ``.pt``/``.pth`` state dict with ``arch``; or None with ``torch``;
* ``arch`` — for a ``.pt``/``.pth`` file, a linearkit model file of the same layers;
* ``torch`` — ``"package.module:attr"``: a torch ``nn.Module`` there, or a class or function
  that builds one with no arguments;
* ``data`` — ``"mnist1d"`` (100 training rows of MNIST-1D and their labels), or paths:
  ``"X.npy"``, ``"X.npy,Y.npy"`` (or a list of one or two paths), or one ``.npz`` holding ``x``
  (and ``y``); None: a random probe;
* ``input_shape`` — the random probe's shape, batch first (a tuple, or ``"64,40"``);
* ``precision`` — a dtype name to check readiness for (``bfloat16``, ``float16``) or None;
* ``json`` — print the report as one JSON object instead of text;
* ``html`` — also write the self-contained HTML page to this path (or None).

A mistake in the arguments raises :class:`DoctorUsageError` (a ValueError) with a one-line
message naming the fix; the command shows it as a usage error.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

__all__ = ["DoctorUsageError", "load_data", "load_torch", "run"]

#: Rows of MNIST-1D ``--data mnist1d`` examines (the recipe's batch size).
MNIST1D_ROWS = 100


class DoctorUsageError(ValueError):
    """A mistake in ``linearkit doctor``'s arguments (shown as one line, exit status 2)."""


def load_torch(spec: str):
    """The torch ``nn.Module`` that ``"module:attr"`` names (a class or a zero-argument function
    there is called to build one). The module is imported with the current directory on
    ``sys.path``, as ``python -m`` would."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise DoctorUsageError(f"--torch {spec!r}: expected MODULE:ATTR, e.g. mynet:model or "
                               "mypkg.models:build")
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:  # for the import only: sys.path is put back afterwards
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DoctorUsageError(f"--torch {spec!r}: cannot import {module_name!r} ({exc})"
                               ) from None
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise DoctorUsageError(f"--torch {spec!r}: {module_name!r} has no attribute "
                                   f"{attr!r}")
        obj = getattr(obj, part)
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.nn.Module):
        if callable(obj):
            try:
                obj = obj()
            except TypeError as exc:  # it needs arguments: not a builder this command can call
                raise DoctorUsageError(f"--torch {spec!r}: calling it with no arguments failed "
                                       f"({exc}); name a torch.nn.Module, or a class or "
                                       "function that builds one with no arguments") from None
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(obj, torch.nn.Module):
            raise DoctorUsageError(f"--torch {spec!r} is a {type(obj).__name__}, not a "
                                   "torch.nn.Module (nor a class or function that builds one)")
    return obj


def _npy(path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise DoctorUsageError(f"--data {path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DoctorUsageError(f"--data {path}: not a .npy/.npz array file ({exc})") from None


def load_data(data) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(x, y)`` for ``--data`` (see the module docstring); ``(None, None)`` for None."""
    if data is None:
        return None, None
    parts = [str(d) for d in data] if isinstance(data, (list, tuple)) else str(data).split(",")
    parts = [p.strip() for p in parts if p.strip()]
    if parts == ["mnist1d"]:
        from ...data import mnist1d

        d = mnist1d()
        return d.x_train[:MNIST1D_ROWS], d.y_train[:MNIST1D_ROWS]
    if len(parts) == 1 and parts[0].endswith(".npz"):
        arrays = _npy(parts[0])
        keys = list(arrays.files)
        x_key = "x" if "x" in keys else keys[0] if keys else None
        if x_key is None:
            raise DoctorUsageError(f"--data {parts[0]}: the archive holds no array")
        y_key = "y" if "y" in keys else (keys[1] if len(keys) > 1 and x_key == keys[0]
                                         else None)
        return arrays[x_key], None if y_key is None else arrays[y_key]
    if len(parts) not in (1, 2):
        raise DoctorUsageError(f"--data: expected mnist1d, X.npy or X.npy,Y.npy; got {data!r}")
    x = _npy(parts[0])
    y = _npy(parts[1]) if len(parts) == 2 else None
    if y is not None and len(y) != len(x):
        raise DoctorUsageError(f"--data: {parts[0]} has {len(x)} rows but {parts[1]} has "
                               f"{len(y)}")
    return x, y


def _shape(value):
    if value is None or isinstance(value, tuple):
        return value
    try:
        return tuple(int(p) for p in str(value).split(","))
    except ValueError:
        raise DoctorUsageError(f"--input-shape {value!r}: expected comma-separated integers "
                               "with the batch first, like 64,40") from None


def run(args) -> int:
    """Run ``linearkit doctor`` for ``args``; prints the report, returns the exit status 0.

    Raises :class:`DoctorUsageError` for a mistake in the arguments.
    """
    from .diagnosis import doctor

    file, spec = getattr(args, "file", None), getattr(args, "torch", None)
    if (file is None) == (spec is None):
        raise DoctorUsageError("give a model FILE or --torch MODULE:ATTR (exactly one)")
    if file is not None:
        if not os.path.isfile(file):
            raise DoctorUsageError(f"{file}: no such file")
        arch = getattr(args, "arch", None)
        if arch is not None and not os.path.isfile(arch):
            raise DoctorUsageError(f"--arch {arch}: no such file")
        from ...io.convert import load_any

        model = load_any(file, arch)
    else:
        model = load_torch(spec)
    html_path = getattr(args, "html", None)
    if html_path is not None and os.path.isdir(html_path):
        raise DoctorUsageError(f"--html {html_path} is a folder; name a file, e.g. "
                               f"{os.path.join(html_path, 'doctor.html')}")
    x, y = load_data(getattr(args, "data", None))
    shape = _shape(getattr(args, "input_shape", None))
    if x is not None and shape is not None:
        raise DoctorUsageError("give --data or --input-shape, not both")
    dtype = getattr(args, "precision", None)
    if dtype is not None:
        from ..range_check import dtype_limits

        try:
            dtype_limits(dtype)
        except (TypeError, ImportError) as exc:
            raise DoctorUsageError(f"--precision {dtype}: {exc}") from None
    report = doctor(model, x, y, input_shape=shape, dtype=dtype, source_file=file)
    if html_path is not None:
        report.html(html_path)
    if getattr(args, "json", False):
        print(report.json())
    else:
        print(report.text())
        if html_path is not None:
            print(f"\nHTML report written to {html_path}")
    return 0
