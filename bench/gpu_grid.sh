#!/usr/bin/env bash
# The grid items of docs/gpus.md, "The GPU checklist": the `tune` flow itself (`damptune
# tune`: a temporary Prefect server, Optuna on SQLite, MLflow on SQLite, a local Dask cluster
# with one worker per GPU) with device=cuda, then `damptune report`, on a GPU machine with
# PyTorch's CUDA build as its python3, from the repository's root: bash bench/gpu_grid.sh
# A machine that reaches no registry gets every other package as wheels in .whl, downloaded
# where pip works, for its Python (3.12 here), e.g.
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_28_x86_64 -d .whl "prefect==3.8.8" "fastapi>=0.139,<0.151" \
#     "mlflow==3.17.2" "optuna==5.0.0" "sqlalchemy>=2,<2.1" dask[distributed]==2026.8.0 mnist1d
# less the wheels of packages the machine already has, to fit the 64 MiB a call carries: on the
# lent machines' image (2026-11-28) these 209 MiB came to 61 MiB without pyarrow, scipy, numpy,
# pandas, matplotlib, scikit_learn, pillow, fonttools, kiwisolver, contourpy, joblib,
# threadpoolctl, pyparsing, cycler, narwhals, pygments, ruamel_yaml_clib, aiohttp, multidict,
# frozenlist, propcache, yarl, regex and pyyaml. Keep databricks_sdk: `import mlflow` needs
# its `databricks` namespace.
# Networks of 1 rank: a machine with one GPU (the grid's cells put one rank on each GPU).
# Each grid prints its answer; none stops the other.
set -u
. bench/device_site.sh
python3 -c "import torch, prefect, optuna, mlflow; print('torch', torch.__version__, 'gpus',
torch.cuda.device_count(), 'prefect', prefect.__version__, 'optuna', optuna.__version__,
'mlflow', mlflow.__version__)" || exit 1
out=${OUT:-/tmp}/gpu-grid
quiet() { grep -v "^INFO\|distributed\.\|^\[I \|Using an existing\|A new study"; }

echo "== damptune tune --device cuda: MLP and CNN on MNIST-1D, network 1"
start=$(date +%s)
timeout 300 python3 -m damptune tune --device cuda --networks 1 --models mlp,cnn \
  --algorithms geodamplr,geodamp,padadamp --per-worker-batch 256 --trials 4 \
  --validation-seeds 3 --grid-name gpu --run-dir "$out/gpu" --no-progress 2>&1 | quiet | tail -25
echo "wall: $(( $(date +%s) - start )) s"
python3 -m damptune report --run-dir "$out/gpu" 2>&1 | quiet | sed -n '1,40p'
nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l | xargs echo "GPU processes left:"

echo "== damptune tune --device cuda: WRN-16-4 on digits, network 1"
start=$(date +%s)
timeout 240 python3 -m damptune tune --device cuda --networks 1 --models wrn16_4 \
  --dataset digits --algorithms geodamplr,padadamp --per-worker-batch 256 --trials 3 \
  --validation-seeds 2 --epochs 4 --target 0.6 --grid-name wrn --run-dir "$out/wrn" \
  --no-progress 2>&1 | quiet | tail -15
echo "wall: $(( $(date +%s) - start )) s"
python3 -m damptune report --run-dir "$out/wrn" 2>&1 | quiet | sed -n '1,25p'
