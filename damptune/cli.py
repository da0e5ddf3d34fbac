"""Command line: ``damptune train|simulate ...`` (also ``python -m damptune``);
``damptune --version`` prints the installed package's version."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

from damptune.netmodel import DEFAULT_PROFILE
from damptune.records import EvalRecord, Record, UpdateRecord

__all__ = ["main", "build_parser"]


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _installed_version() -> str:
    """The version of the installed ``damptune`` distribution (its metadata), or a note that
    it is not installed (run from a checkout without ``pip install``)."""
    try:
        return version("damptune")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . from the checkout)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="damptune", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)

    from damptune import overhead_cli, simulate

    simulate.add_parser(sub)
    overhead_cli.add_parser(sub)
    # commands of other packages (the tuning pipeline registers `tune` and `report`)
    for entry in entry_points(group="damptune.commands"):
        entry.load()(sub)
    return parser


def _add_train_parser(sub: Any) -> None:
    t = sub.add_parser("train", help="train one model with one damper and print a summary")
    t.add_argument("--model", default="mlp", help="model name (mlp, cnn, wrn16_4)")
    t.add_argument("--dataset", default="mnist1d", help="mnist1d, digits, synthetic, cifar10")
    t.add_argument("--data-root", default=None, help="directory of a local dataset (cifar10)")
    t.add_argument("--damper", default="geodamp", help="sgd, geodamplr, cntsdamplr, geodamp, "
                   "padadamp, adadamp, radadamp")
    t.add_argument("--initial", type=int, default=32, help="initial batch size B0 (examples)")
    t.add_argument("--param", action="append", type=_key_value, default=[], metavar="NAME=VALUE",
                   help="a damper hyperparameter, e.g. --param factor=2 --param delay=5")
    t.add_argument("--lr", type=float, default=0.05, help="initial learning rate lr0")
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--epochs", type=float, default=10.0, help="passes over the training set")
    t.add_argument("--max-updates", type=int, default=None, help="stop after this many updates")
    t.add_argument("--max-batch-size", type=int, default=None,
                   help="cap in examples (default: workers x per-worker-batch)")
    t.add_argument("--per-worker-batch", type=int, default=128, help="examples per rank")
    t.add_argument("--workers", type=int, default=4, help="most ranks (Dask workers)")
    t.add_argument("--min-workers", type=int, default=1)
    t.add_argument("--processes", type=int, default=None,
                   help="Dask workers the ranks run on (default: one per rank); fewer each run "
                   "several ranks' shares of the batch (centralized mode)")
    t.add_argument("--mode", default="centralized",
                   help="local, centralized or decentralized")
    t.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (default: start a LocalCluster)")
    t.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (each rank on "
                   "its worker's GPU; NCCL when every rank has its own)")
    t.add_argument("--share-gpus", action="store_true",
                   help="let ranks share a GPU (then gloo); without it that is an error")
    t.add_argument("--micro-batch", type=int, default=None,
                   help="examples per forward+backward pass of a rank (default: "
                   "--per-worker-batch); bounds GPU memory")
    t.add_argument("--eval-every", type=float, default=1.0, help="epochs between evaluations")
    t.add_argument("--eval-flush", action="store_true",
                   help="end the ranks' segment at each evaluation, so it is shown at once "
                   "(default: evaluations travel with the segment, <= 1 s of training)")
    t.add_argument("--seed", type=int, default=0,
                   help="seed of the training: initial weights, data order")
    t.add_argument("--data-seed", type=int, default=0,
                   help="seed of the generated dataset (mnist1d, synthetic), as in tune")
    t.add_argument("--checkpoint", default=None, help="checkpoint path or fsspec URL")
    t.add_argument("--checkpoint-every", type=int, default=None, help="updates between saves")
    t.add_argument("--checkpoint-seconds", type=float, default=None,
                   help="seconds of training between saves")
    t.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="network profile of the simulated time (see `damptune simulate`)")
    t.add_argument("--sync", default="sync", help="how an update tolerates the profile's "
                   "stragglers: sync, backup:B or ssp:S (docs/engine.md)")


def _progress_bar(args: argparse.Namespace, n_train: int) -> tuple[Any, Callable[[Record], None]]:
    """A tqdm bar over examples seen, and the callback that moves it."""
    from tqdm import tqdm

    bar = tqdm(total=round(args.epochs * n_train), unit="ex", unit_scale=True,
               disable=args.no_progress, file=sys.stderr, desc=f"{args.model}/{args.damper}")
    last: dict[str, Any] = {}

    def progress(record: Record) -> None:
        if isinstance(record, EvalRecord):
            last["acc"] = record.test_accuracy
            return
        bar.update(record.examples_seen - bar.n)
        if isinstance(record, UpdateRecord):
            bar.set_postfix(loss=f"{record.loss:.3f}", B=record.batch_size, P=record.n_workers,
                            acc=f"{last.get('acc', float('nan')):.3f}", refresh=False)

    return bar, progress


def _classifier(args: argparse.Namespace, callback: Callable[[Record], None]) -> Any:
    import models
    from damptune.estimator import DampedClassifier

    return DampedClassifier(
        module=models.model_class(args.model), optimizer__momentum=args.momentum, lr=args.lr,
        batch_size=args.damper, batch_size__initial=args.initial,
        max_batch_size=args.max_batch_size, per_worker_batch=args.per_worker_batch,
        min_workers=args.min_workers, max_workers=args.workers, max_epochs=args.epochs,
        max_updates=args.max_updates, eval_every=args.eval_every, mode=args.mode,
        cluster=args.scheduler, processes=args.processes, device=args.device,
        share_gpus=args.share_gpus,
        micro_batch=args.micro_batch, seed=args.seed, eval_flush=args.eval_flush,
        checkpoint_path=args.checkpoint, checkpoint_every=args.checkpoint_every,
        checkpoint_seconds=args.checkpoint_seconds, resume=args.resume, profile=args.profile,
        sync=args.sync, callback=callback, **{f"batch_size__{k}": v for k, v in args.param},
    )


def _summary(args: argparse.Namespace, clf: Any, n_train: int, wall: float) -> dict[str, Any]:
    evals = [r for r in clf.history_ if r["kind"] == "eval"]
    updates = [r for r in clf.history_ if r["kind"] == "update"]
    return {
        "model": args.model, "dataset": args.dataset, "damper": args.damper, "mode": args.mode,
        "test_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "updates": clf.n_updates_,
        "examples_seen": clf.examples_seen_,
        "epochs": clf.examples_seen_ / n_train,
        "final_batch_size": updates[-1]["batch_size"] if updates else None,
        "max_workers_used": max((r["n_workers"] for r in updates), default=0),
        "train_seconds": clf.state_.time_elapsed,
        "simulated_seconds": clf.state_.time_sim,
        "profile": args.profile,
        "sync": args.sync,
        "wall_seconds": wall,
        "stopped": clf.stopped_,
        "interrupted": clf.state_.interrupted,
    }


def _train(args: argparse.Namespace) -> int:
    import models
    from damptune import interrupt
    from damptune.validate import seed_int

    data = models.load_dataset(args.dataset, seed=seed_int("data_seed", args.data_seed),
                               root=args.data_root)
    n_train = len(data.y_train)
    bar, progress = _progress_bar(args, n_train)
    clf = _classifier(args, progress)
    interrupt.install_sigterm_handler()  # SIGTERM: checkpoint, then stop (resume continues)
    t0 = time.perf_counter()
    clf.fit(data.X_train, data.y_train, eval_set=(data.X_test, data.y_test))
    wall = time.perf_counter() - t0
    bar.close()
    summary = _summary(args, clf, n_train, wall)
    if clf.state_.interrupted:
        print(f"{clf.stopped_}; checkpoint {args.checkpoint}: run again with --resume to continue",
              file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.model} on {args.dataset} with {args.damper} ({args.mode}): "
              f"test accuracy {summary['test_accuracy']:.4f} after {summary['updates']} updates, "
              f"{summary['examples_seen']} examples ({summary['epochs']:.2f} epochs), "
              f"final batch {summary['final_batch_size']} on {summary['max_workers_used']} ranks "
              f"max; training {summary['train_seconds']:.1f} s, wall {wall:.1f} s; simulated "
              f"{summary['simulated_seconds']:.1f} s on {args.profile}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from damptune.errors import ClusterError, DamptuneError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "simulate":
            from damptune import simulate

            return simulate.run(args)
        if hasattr(args, "handler"):
            return int(args.handler(args))
    except ClusterError as exc:  # a fault of the cluster, not of the input: run it again
        print(f"damptune {args.command}: cluster fault: {exc}", file=sys.stderr)
        return 75
    except (DamptuneError, ValueError) as exc:
        print(f"damptune {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 1
