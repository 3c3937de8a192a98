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
                          eval_every=args.eval_every, progress=progress)
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
    train.add_argument("--out", default=None,
                       help="where to save the weights (.safetensors); default runs/mnist1d-MODEL.safetensors")
    train.add_argument("--json", action="store_true",
                       help="no progress bar; print one JSON object with the results")
    train.set_defaults(run=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
