#!/usr/bin/env bash
# The GPU checklist of docs/gpus.md, in one go on a GPU machine with PyTorch's CUDA build as
# its python3, from the repository's root: bash bench/gpu_run.sh
# A machine that reaches no registry gets the engine's other packages as wheels in .whl,
# downloaded where pip works (Python 3.12 here):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 -d .whl \
#     dask==2026.8.0 distributed==2026.8.0 tornado==6.6.1 tblib==3.2.2 zict==3.0.0 \
#     locket==1.0.0 partd==1.4.2 cloudpickle==3.1.3 toolz==1.2.0 mnist1d==0.0.2.post1
# The grid items of the list are bench/gpu_grid.sh (it needs Prefect, Optuna and MLflow too).
# Each step prints its result; none stops the others.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, dask; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'gpus', torch.cuda.device_count(), 'dask', dask.__version__)"

echo "== pytest -m gpu tests/damptune/test_gpu.py"
timeout 150 python3 -m pytest -m gpu tests/damptune/test_gpu.py -p no:cacheprovider -q \
  -o addopts="-ra --import-mode=importlib" 2>&1 | grep -v "^INFO\|distributed\." | tail -30

echo "== damptune train: WRN-16-4 on digits, CUDA, one rank, both modes"
for mode in centralized decentralized; do
  timeout 90 python3 -m damptune train --model wrn16_4 --dataset digits --device cuda \
    --workers 1 --mode "$mode" --epochs 1 2>&1 | grep -v "^INFO\|distributed\." | tail -6
done
echo "== two ranks on one GPU: refused without --share-gpus, trained with it"
timeout 60 python3 -m damptune train --model wrn16_4 --dataset digits --device cuda \
  --workers 2 --mode centralized --epochs 1 2>&1 | grep -v "^INFO\|distributed\." | tail -4
timeout 90 python3 -m damptune train --model wrn16_4 --dataset digits --device cuda \
  --workers 2 --mode centralized --epochs 1 --share-gpus 2>&1 \
  | grep -v "^INFO\|distributed\." | tail -6

echo "== GPU memory: one WRN-16-4 pass of 512 CIFAR-sized examples, and in micro-batches of 128"
timeout 60 python3 - <<'PY'
import numpy as np
import torch

from damptune.loop import shard_forward
from models import WideResNet

model = WideResNet(input_shape=(3, 32, 32), n_classes=10).cuda()
X = torch.randn(512, 3, 32, 32, device="cuda")
y = torch.randint(0, 10, (512,), device="cuda")
for micro in (None, 128):
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    shard_forward(model, X, y, np.arange(512), grad=True, micro_batch=micro)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    print(f"micro_batch={micro}: peak {peak / 2**20:.0f} MiB above the model and data")
PY

echo "== step time against DDP over NCCL (bench/step_time.py --device cuda), a GPU per rank"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
ranks=$(python3 -c "print(','.join(str(p) for p in (1, 2, 4, 8) if p <= $gpus))")
timeout 240 python3 bench/step_time.py --device cuda --ranks "$ranks" 2>&1 \
  | grep -v "^INFO\|distributed\." | tail -20
