"""The cluster YAML files of infra/ load their class, with its extra installed, and every
keyword they give is one the class takes (tests/infra/cluster_keywords.py); the SLURM one
builds a real dask-jobqueue cluster (its job script)."""

import glob
import os

import pytest
import yaml

from infra.stack import REPO_ROOT
from tests.infra.cluster_keywords import RECORDED, keywords, load, recorded_keywords

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


def unknown_keywords(kwargs, accepted):
    """The keys of ``kwargs`` not in ``accepted``; and of a SpecCluster spec's ``options``
    (``{"cls": ..., "options": {...}}``), those its ``cls`` does not accept."""
    unknown = sorted(set(kwargs) - accepted)
    for key, value in kwargs.items():
        if isinstance(value, dict) and set(value) == {"cls", "options"}:
            unknown += [f"{key}.options.{k}" for k in
                        unknown_keywords(value["options"], keywords(load(value["cls"])))]
    return unknown


CHECKED_LIVE = [p for p in SPECS if spec_of(p)["class"] not in RECORDED]


@pytest.mark.parametrize("path", CHECKED_LIVE, ids=os.path.basename)
def test_cluster_yaml_loads_its_class_and_its_kwargs_fit(path):
    """Every keyword of the YAML is one its class takes, following the class's **kwargs to
    where they go (a misspelt keyword would be swallowed by **kwargs until the cluster
    starts on the user's machines)."""
    spec = spec_of(path)
    pytest.importorskip(spec["class"].split(".")[0], reason=f"extra of {os.path.basename(path)} "
                        "not installed")
    cls = load(spec["class"])
    assert unknown_keywords(spec.get("kwargs") or {}, keywords(cls)) == []


@pytest.mark.parametrize("path", sorted(set(SPECS) - set(CHECKED_LIVE)), ids=os.path.basename)
def test_cluster_yaml_of_an_extra_not_in_dev_fits_its_pinned_class(path):
    """The kubernetes and aws extras are not in dev (too many dependencies): the YAML's
    keywords are checked against those recorded from the pinned wheel's source, recorded
    for the pin that pyproject.toml has; with the extra installed, against the class."""
    spec = spec_of(path)
    entry = RECORDED[spec["class"]]
    with open(os.path.join(REPO_ROOT, "pyproject.toml")) as f:
        assert f'["{entry.pin}"]' in f.read(), f"re-record {spec['class']} for its new pin"
    accepted = recorded_keywords(spec["class"])
    assert unknown_keywords(spec.get("kwargs") or {}, accepted) == []
    try:
        cls = load(spec["class"])
    except ImportError:
        return  # not installed: the recorded keywords are the check
    assert keywords(cls) == accepted


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


# the container clusters: the keyword of the class that sets the worker containers' environment
CONTAINER_ENV = {"dask_kubernetes.operator.KubeCluster": ("image", "env"),
                 "dask_cloudprovider.aws.EC2Cluster": ("docker_image", "env_vars")}


def _tested(package):
    """The version of ``package`` in constraints.txt (the tested set)."""
    with open(os.path.join(REPO_ROOT, "constraints.txt")) as f:
        return next(line.split("==")[1].strip() for line in f
                    if line.split("==")[0].strip().lower() == package)


@pytest.mark.parametrize("path", [p for p in SPECS if spec_of(p)["class"] in CONTAINER_ENV],
                         ids=os.path.basename)
def test_container_cluster_yaml_installs_damptune_and_the_tested_torch(path):
    """Dask's stock image holds neither torch nor damptune: the YAML's workers install both at
    start (the image's EXTRA_PIP_PACKAGES), torch at the tested version, in the image of the
    tested dask release (and so does infra/Dockerfile.worker's)."""
    spec = spec_of(path)
    image_key, env_key = CONTAINER_ENV[spec["class"]]
    kwargs = spec["kwargs"]
    assert kwargs[image_key] == f"ghcr.io/dask/dask:{_tested('dask')}-py3.11", kwargs
    packages = kwargs[env_key]["EXTRA_PIP_PACKAGES"].split()
    assert f"torch=={_tested('torch')}" in packages, packages
    assert any(p.startswith("damptune@") for p in packages), packages
    with open(os.path.join(REPO_ROOT, "infra", "Dockerfile.worker")) as f:
        assert f"FROM {kwargs[image_key]}\n" in f.read()
