"""The ``linearkit`` command: ``train`` (the main job), ``ledger``, ``gradcheck``, ``experiment``."""

from __future__ import annotations

import argparse
import json
import sys


def _train(args: argparse.Namespace) -> int:
    from .io import save
    from .train import PAPER_ACCURACY, train

    bar = None
    progress = None
    if not args.json:
        try:
            from tqdm import tqdm
        except ImportError:  # the cli extra brings tqdm; without it, print every eval
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=args.steps, unit="step", dynamic_ncols=True, mininterval=0.25)
            last_acc = {"test": float("nan")}

            def progress(step, loss, test_acc):
                if test_acc is not None:
                    last_acc["test"] = test_acc
                bar.update(1)
                if step % 50 == 0 or test_acc is not None:
                    bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{last_acc['test']:.1%}",
                                    refresh=False)
        else:
            def progress(step, loss, test_acc):
                if test_acc is not None:
                    print(f"step {step:>6}  loss {loss:.4f}  test accuracy {test_acc:.1%}")

    model, result = train(args.model, hidden=args.hidden, steps=args.steps, lr=args.lr,
                          batch_size=args.batch_size, seed=args.seed,
                          eval_every=args.eval_every, progress=progress,
                          threads=None if args.threads == "default" else
                          ("auto" if args.threads == "auto" else int(args.threads)))
    if bar is not None:
        bar.close()
    out = args.out or f"runs/mnist1d-{args.model}.safetensors"
    save(model, out, metadata={"linearkit.recipe": json.dumps(vars(args), default=str)})
    if args.json:
        record = {k: v for k, v in result.to_dict().items() if k != "history"}
        record["out"] = out
        print(json.dumps(record))
        return 0
    print(model)
    print(f"parameters: {result.params:,}")
    print(f"trained {result.steps:,} steps in {result.seconds:.2f} s "
          f"({result.steps / max(result.seconds, 1e-9):,.0f} steps/s); final loss {result.final_loss:.4f}")
    print(f"train accuracy: {result.train_accuracy:.1%}")
    print(f"test accuracy:  {result.test_accuracy:.1%}")
    print("paper (Greydanus 2020, MNIST-1D): logistic regression "
          f"{PAPER_ACCURACY['linear']:.0%}, MLP {PAPER_ACCURACY['mlp']:.0%}  "
          f"<- this run: {args.model} {result.test_accuracy:.1%}")
    print(f"weights saved to {out}")
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from .analysis.ledger import PRESETS, ledger
    from .errors import ShapeError

    shape = None
    if args.input_shape:
        try:
            shape = tuple(int(v) for v in args.input_shape.replace("x", ",").split(",") if v)
        except ValueError:
            print(f"--input-shape must be comma-separated ints like 64,784; got {args.input_shape!r}",
                  file=sys.stderr)
            return 2
    elif args.model in PRESETS:
        shape = PRESETS[args.model][1]
    optimizer = None if args.optimizer == "none" else args.optimizer
    try:
        report = ledger(args.model, shape, optimizer=optimizer, dtype=args.dtype)
    except (ShapeError, KeyError, FileNotFoundError, ValueError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), default=str))
    elif args.markdown:
        print(report.to_markdown())
    else:
        print(report)
    return 0


def _gradcheck(args: argparse.Namespace) -> int:
    import numpy as np

    from . import layers
    from .analysis.gradcheck import gradcheck

    rng = np.random.default_rng(0)
    f64 = {"dtype": np.float64}
    cases = {
        "Linear": (layers.Linear(5, 4, **f64), (3, 5)),
        "Linear(bias=False)": (layers.Linear(5, 4, bias=False, **f64), (2, 3, 5)),
        "ReLU": (layers.ReLU(), (4, 6)),
        "LeakyReLU": (layers.LeakyReLU(0.1), (4, 6)),
        "GELU": (layers.GELU(), (4, 6)),
        "GELU(tanh)": (layers.GELU("tanh"), (4, 6)),
        "Tanh": (layers.Tanh(), (4, 6)),
        "Sigmoid": (layers.Sigmoid(), (4, 6)),
        "SiLU": (layers.SiLU(), (4, 6)),
        "Softmax": (layers.Softmax(dim=-1), (4, 6)),
        "LogSoftmax": (layers.LogSoftmax(dim=-1), (4, 6)),
        "LayerNorm": (layers.LayerNorm(6, **f64), (4, 6)),
        "BatchNorm1d": (layers.BatchNorm1d(6, **f64), (4, 6)),
        "Flatten": (layers.Flatten(), (2, 3, 4)),
        "Residual MLP": (layers.Sequential(
            layers.Linear(6, 8, **f64), layers.ReLU(),
            layers.Residual(layers.Sequential(layers.Linear(8, 8, **f64), layers.GELU())),
            layers.Linear(8, 3, **f64)), (5, 6)),
    }
    failures = 0
    for name, (module, shape) in cases.items():
        x = rng.standard_normal(shape)
        if "ReLU" in name:  # keep inputs away from the kink, where the derivative is undefined
            x = np.where(np.abs(x) < 0.05, 0.5, x)
        result = gradcheck(module, x)
        failures += not result.ok
        status = "ok  " if result.ok else "FAIL"
        print(f"{status} {name:<20} max abs error {result.max_abs_error:.2e}  "
              f"max rel error {result.max_rel_error:.2e}")
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


def _experiment(args: argparse.Namespace) -> int:
    from .experiments import init_depth

    return init_depth.main(args.rest) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linearkit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train an MNIST-1D baseline (the paper's MLP by default)")
    train.add_argument("--model", choices=["mlp", "linear"], default="mlp")
    train.add_argument("--hidden", type=int, default=100, help="hidden width of the MLP (100)")
    train.add_argument("--steps", type=int, default=6000)
    train.add_argument("--lr", type=float, default=1e-2)
    train.add_argument("--batch-size", type=int, default=100)
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--eval-every", type=int, default=500, help="evaluate every N steps")
    train.add_argument("--threads", default="auto",
                       help="BLAS threads: auto (1 for small models), a number, or default")
    train.add_argument("--out", default=None,
                       help="where to save the weights (.safetensors); default runs/mnist1d-MODEL.safetensors")
    train.add_argument("--json", action="store_true",
                       help="no progress bar; print one JSON object with the results")
    train.set_defaults(run=_train)

    ledger = commands.add_parser(
        "ledger", help="parameters, FLOPs, memory and redundant structure of a model, per layer")
    ledger.add_argument("model", help="a .safetensors file or a preset: mlp-mnist, mnist1d, "
                                      "linear-4096, linear-512-256, linear-1024-4096")
    ledger.add_argument("--input-shape", help="input shape with batch, e.g. 64,784")
    ledger.add_argument("--optimizer", default="adam",
                        choices=["adam", "adamw", "sgd", "sgd-momentum", "none"])
    ledger.add_argument("--dtype", default=None, help="storage dtype, e.g. float16 (default: the model's)")
    output = ledger.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true")
    output.add_argument("--json", action="store_true")
    ledger.set_defaults(run=_ledger)

    check = commands.add_parser(
        "gradcheck", help="self-check: every shipped module's backward vs central differences")
    check.set_defaults(run=_gradcheck)

    experiment = commands.add_parser("experiment", help="reproduce an experiment (init-depth)")
    experiment.add_argument("rest", nargs=argparse.REMAINDER,
                            help="init-depth [--quick] [--out DIR]")
    experiment.set_defaults(run=_experiment)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
