#!/usr/bin/env bash
# GPU tier: every suite at full budget on CUDA, one command on a GPU machine:
#   bash benchmark/gpu.sh                       # all suites, 5 seeds (the verdict's minimum), one run per CPU core
#   SUITES="classic" SEEDS=10 JOBS=8 BACKEND=ray bash benchmark/gpu.sh    # RAY_ADDRESS=host:port: a cluster
# Writes benchmark/reports/<suite>-cuda-<date>-<HHMM>-<commit>.md (+ curves) per suite; runs go to runs/benchmark/<suite>-cuda/
# and a second invocation resumes them (finished runs are kept). Suites whose scripts are not written yet say so
# and are skipped. Exit status 1 if any run crashed (every suite is still run and reported).
set -uo pipefail
cd "$(dirname "$0")/.."
SUITES=${SUITES:-"classic continuous atari marl"}
SEEDS=${SEEDS:-5}
JOBS=${JOBS:-$(nproc)}
BACKEND=${BACKEND:-local}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=offline
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: no CUDA device visible to torch')" || exit 2
python -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
status=0
for suite in $SUITES; do
    echo "=== suite $suite ($SEEDS seeds, $JOBS jobs, backend $BACKEND) ==="
    python benchmark/run.py --suite "$suite" --device cuda --seeds "$SEEDS" --jobs "$JOBS" --backend "$BACKEND" || status=1
done
exit $status
