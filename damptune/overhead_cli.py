"""``damptune overhead``: measure this cluster's orchestration overhead per update (a fixed
part plus a part per rank) for a mode and model, to simulate your own cluster with it."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    o = sub.add_parser("overhead", help="measure the per-update orchestration overhead",
                       description=__doc__)
    o.add_argument("--model", default="mlp", help="mlp, cnn, wrn16_4")
    o.add_argument("--dataset", default="mnist1d")
    o.add_argument("--data-root", default=None)
    o.add_argument("--mode", default="centralized", help="centralized or decentralized")
    o.add_argument("--ranks", default="1,2,4,8", help="numbers of ranks to measure, e.g. 1,2,4")
    o.add_argument("--per-worker-batch", type=int, default=32, help="examples per rank")
    o.add_argument("--updates", type=int, default=40, help="updates measured at each P")
    o.add_argument("--scheduler", default=None, help="a running Dask scheduler (default: a "
                   "LocalCluster of max(ranks) workers)")
    o.add_argument("--device", default="cpu")
    o.add_argument("--json", action="store_true")
    o.set_defaults(handler=run)


def _ranks(text: str) -> list[int]:
    from damptune.errors import ConfigError

    try:
        ranks = sorted({int(p) for p in text.split(",")})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise ConfigError("--ranks", text, "comma-separated numbers of ranks >= 1, e.g. 1,2,4")
    return ranks


def run(args: argparse.Namespace) -> int:
    import models
    from damptune.cluster import connect
    from damptune.config import TrainConfig, import_path
    from damptune.overhead import measure_overhead
    from damptune.state import TrainData

    ranks = _ranks(args.ranks)
    ds = models.load_dataset(args.dataset, seed=0, root=args.data_root)
    data = TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)
    config = TrainConfig(
        module=import_path(models.model_class(args.model)),
        module_kwargs={"input_shape": tuple(ds.input_shape), "n_classes": int(ds.n_classes)},
        per_worker_batch=args.per_worker_batch, max_workers=max(ranks), mode=args.mode,
        device=args.device)
    config.validate()
    with connect(args.scheduler, n_workers=max(ranks)) as client:
        fit = measure_overhead(config, data, ranks=ranks, updates=args.updates, cluster=client)
    out = {"mode": args.mode, "model": args.model, **fit.as_dict()}
    if args.json:
        print(json.dumps(out))
    else:
        for point in out["points"]:
            print(f"P={point['ranks']}: {point['ms']:.2f} ms per update beyond computing")
        print(f"{args.mode}: overhead {out['overhead_ms']:.2f} ms + "
              f"{out['overhead_per_rank_ms']:.2f} ms per rank per update; simulate with "
              f"--overhead-ms {out['overhead_ms']:.2f} --overhead-per-rank-ms "
              f"{out['overhead_per_rank_ms']:.2f}")
    return 0
