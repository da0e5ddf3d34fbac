"""A cluster YAML that its class takes is accepted, the keywords its class passes on to its
workers included (tests/flows/test_bad_input.py has the refusals): the check refuses only what
the cluster would refuse."""

import glob
import os

import pytest

from damptune import ConfigError
from infra.stack import REPO_ROOT
from tasks.cluster_yaml import read_cluster_yaml
from tasks.clusters import check_cluster, open_cluster

SHIPPED = sorted(glob.glob(os.path.join(REPO_ROOT, "infra", "cluster-*.yaml")))
EXTRA_OF = {"cluster-ec2-spot.yaml": "dask_cloudprovider", "cluster-kubernetes.yaml":
            "dask_kubernetes", "cluster-slurm-spot.yaml": "dask_jobqueue"}


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_cluster_yaml_with_its_extra_installed_is_accepted(path):
    extra = EXTRA_OF.get(os.path.basename(path))
    if extra:
        pytest.importorskip(extra, reason=f"the extra of {os.path.basename(path)}")
    check_cluster(path)


def _yaml(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


def test_worker_keywords_of_a_local_cluster_are_accepted_and_its_workers_start(tmp_path):
    """``lifetime`` goes from LocalCluster to its Nanny, then to the Worker; and
    ``connection_limit`` on to the Worker's Server: accepted, and the workers start with
    them. ``workers`` gives the count."""
    path = _yaml(tmp_path, "class: distributed.LocalCluster\nworkers: 1\n"
                 "kwargs: {n_workers: 0, threads_per_worker: 1, host: 127.0.0.1, "
                 "dashboard_address: null, lifetime: 1h, connection_limit: 64}\n")
    assert read_cluster_yaml(path).workers == 1
    with open_cluster(path, n_workers=1, local_directory=str(tmp_path)) as pool:
        assert pool.size == 1


def test_without_processes_local_cluster_keywords_go_to_the_worker_not_a_nanny(tmp_path):
    """With ``processes: false`` LocalCluster's workers are Workers: a Nanny's own keyword
    (``worker_port``) is refused, one of the Worker's (``nanny``) is not."""
    base = "class: distributed.LocalCluster\nkwargs: {processes: false, "
    read_cluster_yaml(_yaml(tmp_path, base + "nanny: null}\n"))
    with pytest.raises(ConfigError, match=r"Unknown: \['worker_port'\]"):
        read_cluster_yaml(_yaml(tmp_path, base + "worker_port: 0}\n"))
