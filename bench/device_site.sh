# Sourced by the device scripts (bench/gpu_grid.sh, bench/device_stability.sh), from the
# repository's root: the packages the machine lacks, from the wheels in .whl, and damptune
# itself (its `tune` and `report` commands are entry points of the installed package), into
# /tmp/site, which PYTHONPATH and PATH then name first. The `pip download` line that fills .whl
# is in bench/gpu_grid.sh's header.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
  --no-cache-dir --upgrade --target /tmp/site . 2>&1 | tail -3
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
