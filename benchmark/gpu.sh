#!/usr/bin/env bash
# The GPU check, one command on a fresh clone on a GPU machine (installs what is missing first):
#   bash benchmark/gpu.sh              # about 11 minutes on one H100: steps/s per family with and without --compile,
#                                      # smac_lite at 1024-8192 battles, MAPPO's time to 0.9 on 3m, a short Pong curve,
#                                      # grpo_lm.py on a random Qwen2-0.5B-shaped model, SB3 beside ppo.py and SAC;
#                                      # writes benchmark/reports/gpu-check/gpu-check-cuda-<date>-...md naming the GPU
#   STEPS="1 2 3" bash benchmark/gpu.sh  # some of the six steps (two calls of under 10 minutes: "1 2 3", "4 5 6")
#   bash benchmark/gpu.sh --dry-run    # the same steps on the CPU with tiny budgets (a test runs it); report in runs/
#   bash benchmark/gpu.sh --suites     # every suite at full budget on CUDA (hours): SUITES="classic" SEEDS=10 JOBS=8
#                                      # BACKEND=ray (RAY_ADDRESS=host:port: a cluster); reruns resume finished runs
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=offline
mode=${1:-check}
case "$mode" in check|--dry-run|--suites) ;; *) echo "usage: bash benchmark/gpu.sh [--dry-run | --suites]" >&2; exit 2;; esac
if ! python -c "import gymnasium, tyro, ale_py, mujoco, pettingzoo, mpe2, envpool, minatar, smac_lite" 2>/dev/null; then
    echo "gpu.sh: installing the project (pip install -e \".[dev]\"; torch==2.13.0 from PyPI is its CUDA build)"
    python -m pip install --quiet -e ".[dev]" || { echo "gpu.sh: the install failed" >&2; exit 2; }
fi
if [ "$mode" = "--dry-run" ]; then
    exec python benchmark/gpu_check.py --dry-run --report-dir "${REPORT_DIR:-runs/gpu-check}"
fi
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: no CUDA device visible to torch')" || exit 2
python -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
if [ "$mode" = "check" ]; then
    exec python benchmark/gpu_check.py --steps ${STEPS:-1 2 3 4 5 6}
fi
SUITES=${SUITES:-"classic continuous atari marl"}
SEEDS=${SEEDS:-5}
JOBS=${JOBS:-$(nproc)}
BACKEND=${BACKEND:-local}
status=0
for suite in $SUITES; do
    echo "=== suite $suite ($SEEDS seeds, $JOBS jobs, backend $BACKEND) ==="
    python benchmark/run.py --suite "$suite" --device cuda --seeds "$SEEDS" --jobs "$JOBS" --backend "$BACKEND" || status=1
done
exit $status
