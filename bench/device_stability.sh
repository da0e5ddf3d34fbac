#!/usr/bin/env bash
# Answer stability of the CNN's half of the default grid, per sampler, on a machine with many
# cores (the lent GPU machine's 16: its CPUs, not its GPU): for each sampler in $SAMPLERS, two
# CNN-only default grids (seeds 0 and 1: each its own sampler and held-out seeds, the same
# data), all at once, each with $CELLS cells at a time; then bench/answer_stability.py on each
# pair. `auto` is the default (TPE for the two-hyperparameter geodamp, geodamplr and adadamp);
# `gp` is a Gaussian process for every space. The grid's simulated times come from each run's
# own calibration, so they are this machine's, not the 2-core one's; what is compared is the
# orderings. From the repository's root: bash bench/device_stability.sh
# A machine that reaches no registry gets the packages it lacks as wheels in .whl (the `pip
# download` line is in bench/gpu_grid.sh's header).
set -u
SAMPLERS=${SAMPLERS:-auto gp} SEEDS=${SEEDS:-0 1} CELLS=${CELLS:-3} LIMIT=${LIMIT:-470}
TRIALS=${TRIALS:-}
if [ -d .whl ]; then . bench/device_site.sh; fi
export PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
nproc
python3 -c "import flows.tune, tasks.tracking, mlflow, optuna, prefect, prefect.server.api.server, docket" || exit 1
out=${OUT:-/tmp}/stability
mkdir -p "$out"
start=$(date +%s)
one() {  # sampler seed
  local name=cnn-$1-s$2
  timeout "$LIMIT" python3 -m damptune tune --models cnn --sampler "$1" --seed "$2" \
    ${TRIALS:+--trials "$TRIALS"} --concurrent-cells "$CELLS" --grid-name "$name" \
    --run-dir "$out/$name" --no-progress > "$out/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - start )) s"
}
for sampler in $SAMPLERS; do for seed in $SEEDS; do one "$sampler" "$seed" & done; done
wait
for sampler in $SAMPLERS; do
  set -- $SEEDS
  echo "== sampler $sampler: seeds $1 and $2"
  python3 bench/answer_stability.py --run-dirs "$out/cnn-$sampler-s$1,$out/cnn-$sampler-s$2" \
    2>&1 | grep -v "^INFO\|distributed\.\|^\[I "
done
rm -rf "$out"/*/checkpoints "$out"/*/mlflow.db "$out"/*/mlartifacts "$out"/*/dask 2>/dev/null
du -sh "$out"
