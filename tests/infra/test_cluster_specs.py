"""The cluster YAML files of infra/ load their class, with its extra installed, and accept
their keyword arguments; the SLURM one builds a real dask-jobqueue cluster (its job script)."""

import glob
import importlib
import inspect
import os

import pytest
import yaml

from infra.stack import REPO_ROOT

SPECS = sorted(glob.glob(os.path.join(REPO_ROOT, "infra", "cluster-*.yaml")))
EXTRA = {"dask_jobqueue": "slurm", "dask_kubernetes": "kubernetes",
         "dask_cloudprovider": "aws", "distributed": None}


def spec_of(path):
    with open(path) as f:
        return yaml.safe_load(f)


def test_every_cluster_yaml_names_a_package_of_an_extra():
    with open(os.path.join(REPO_ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    assert len(SPECS) >= 5
    for path in SPECS:
        package = spec_of(path)["class"].split(".")[0]
        assert package in EXTRA, (path, package)
        if EXTRA[package]:
            assert f"\n{EXTRA[package]} = [" in pyproject, (path, EXTRA[package])


@pytest.mark.parametrize("path", SPECS, ids=os.path.basename)
def test_cluster_yaml_loads_its_class_and_its_kwargs_fit(path):
    spec = spec_of(path)
    module, _, name = spec["class"].rpartition(".")
    pytest.importorskip(module.split(".")[0], reason=f"extra of {os.path.basename(path)} "
                        "not installed")
    cls = getattr(importlib.import_module(module), name)
    inspect.signature(cls.__init__).bind_partial(None, **(spec.get("kwargs") or {}))


def test_slurm_yaml_builds_a_real_jobqueue_cluster_with_spot_settings():
    """dask-jobqueue (the ``slurm`` extra, in ``dev`` too) builds the cluster of
    infra/cluster-slurm-spot.yaml; its job script asks SLURM for the preemption notice and
    gives each worker a lifetime under the walltime."""
    pytest.importorskip("dask_jobqueue")
    from dask_jobqueue import SLURMCluster

    kwargs = spec_of(os.path.join(REPO_ROOT, "infra", "cluster-slurm-spot.yaml"))["kwargs"]
    with SLURMCluster(**kwargs, scheduler_options={"host": "127.0.0.1",
                                                   "dashboard_address": None}) as cluster:
        script = cluster.job_script()
    assert "#SBATCH -t 06:00:00" in script and "#SBATCH --signal=TERM@120" in script
    assert "--lifetime 350m" in script and "--nthreads 1" in script
