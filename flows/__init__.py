"""Prefect flows: they only wire tasks together (grid → cells → trials).

The flow is ``flows.tune.tune`` (prefect.yaml's entrypoint ``flows/tune.py:tune``). This
package imports nothing: ``damptune`` loads ``flows.cli`` for every command (its entry points),
and only ``damptune tune`` needs Prefect, MLflow and the tasks.
"""
