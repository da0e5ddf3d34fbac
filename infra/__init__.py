"""How to run damptune's stack and clusters; not part of the installed package.

- ``infra.stack``: the local Prefect server, work pool and worker, and MLflow server
  (``python -m infra.stack up|down|status``).
- ``infra.main``: the main job (stack up → deploy → run ``tune/grid`` → wait → summary).
- ``infra.netns``: emulated cluster networks (namespaces, veth, tc) for the cost-model check.
- ``cluster-*.yaml``: Dask cluster specs for the flow's ``cluster`` parameter.

Import it with the repository root on ``sys.path`` (pytest's ``pythonpath = ["."]`` does that).
"""
