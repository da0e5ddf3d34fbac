"""The keyword names a cluster class accepts, for checking the cluster YAML files of infra/.

A class's own signature is not enough: dask's cluster classes take ``**kwargs`` and pass them
on, so :func:`keywords` follows them where they go, with the product's own check
(``tasks.cluster_yaml.accepted_keywords``: the next ``__init__`` of the class's MRO,
dask-jobqueue's job class, LocalCluster's Nanny and Worker, a Worker's Server).

The ``kubernetes`` and ``aws`` extras are not in ``dev``: dask-kubernetes pulls kopf, kr8s,
kubernetes, kubernetes-asyncio, pykube-ng and rich, dask-cloudprovider[aws] aiobotocore and
botocore. Their classes' own keywords are recorded in :data:`RECORDED`, read from the source of
the pinned wheels without importing them (their dependencies need not be installed)::

    pip download --no-deps dask-kubernetes==2026.3.0 dask-cloudprovider==2025.9.0 -d wheels
    python -m tests.infra.cluster_keywords wheels/*.whl

and the keywords of the dask base class they pass ``**kwargs`` to come from the installed
``distributed``.
"""

from __future__ import annotations

import ast
import importlib
import sys
import zipfile
from dataclasses import dataclass

from tasks.cluster_yaml import accepted_keywords


@dataclass(frozen=True)
class Recorded:
    """A class's keywords read from its pinned wheel, and the installed class its
    ``**kwargs`` go to."""

    pin: str  # the requirement of its extra in pyproject.toml
    keywords: tuple[str, ...]  # its own __init__'s and its bases' in the same package
    kwargs_to: str  # the dask class (installed) that takes its **kwargs


RECORDED = {
    "dask_kubernetes.operator.KubeCluster": Recorded(
        pin="dask-kubernetes==2026.3.0",
        keywords=("asynchronous", "create_mode", "custom_cluster_spec", "env", "idle_timeout",
                  "image", "jupyter", "loop", "n_workers", "name", "namespace",
                  "port_forward_cluster_ip", "quiet", "resource_timeout", "resources",
                  "scheduler_forward_port", "scheduler_service_type", "shutdown_on_close",
                  "worker_command"),
        kwargs_to="distributed.deploy.Cluster"),
    "dask_cloudprovider.aws.EC2Cluster": Recorded(
        pin="dask-cloudprovider[aws]==2025.9.0",
        keywords=("ami", "auto_shutdown", "availability_zone", "bootstrap", "debug",
                  "docker_args", "docker_image", "enable_detailed_monitoring", "env_vars",
                  "extra_bootstrap", "filesystem_size", "iam_instance_profile",
                  "instance_tags", "instance_type", "key_name", "n_workers", "protocol",
                  "region", "scheduler_instance_type", "scheduler_options", "security",
                  "security_groups", "spot", "subnet_id", "use_private_ip", "volume_tags",
                  "vpc", "worker_class", "worker_instance_type", "worker_options"),
        kwargs_to="distributed.deploy.SpecCluster"),
}

def load(path: str) -> type:
    """The class at a dotted ``path`` (``package.module.Class``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def keywords(cls: type) -> set[str]:
    """The keyword names ``cls(...)`` accepts, following its ``**kwargs`` where they go: the
    product's own check (:func:`tasks.cluster_yaml.accepted_keywords`), which must be able to
    tell for every class a shipped YAML names."""
    accepted = accepted_keywords(cls, {})
    assert accepted is not None, f"where {cls.__name__}'s **kwargs go cannot be told"
    return accepted[0]


def recorded_keywords(path: str) -> set[str]:
    """The keywords of a class of :data:`RECORDED`, with those of the class it passes
    ``**kwargs`` to."""
    entry = RECORDED[path]
    return set(entry.keywords) | keywords(load(entry.kwargs_to))


def read_wheel(wheel: str, class_name: str) -> tuple[list[str], str | None]:
    """From a wheel's source: the keyword names of ``class_name`` and its bases defined in the
    wheel, up to the first ``__init__`` without ``**kwargs``; and the base outside the wheel
    that gets the ``**kwargs`` (None if none does)."""
    classes: dict[str, ast.ClassDef] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in (n for n in z.namelist() if n.endswith(".py")):
            for node in ast.walk(ast.parse(z.read(name))):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, node)
    names: set[str] = set()
    node = classes[class_name]
    while True:
        init = next((f for f in node.body
                     if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if init is not None:
            names |= {a.arg for a in init.args.args[1:] + init.args.kwonlyargs}
            if init.args.kwarg is None:
                return sorted(names), None
        base = ast.unparse(node.bases[0]).rpartition(".")[2]
        if base not in classes:
            return sorted(names), base
        node = classes[base]


if __name__ == "__main__":  # print what RECORDED should hold for the given wheels
    for wheel in sys.argv[1:]:
        for path in RECORDED:
            if wheel.rpartition("/")[2].startswith(path.split(".")[0]):
                own, base = read_wheel(wheel, path.rpartition(".")[2])
                print(f"{path}: keywords={tuple(own)}, **kwargs to {base}")
