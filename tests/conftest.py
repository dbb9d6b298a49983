import os

import pytest
import torch

from benchmark.runs import ALGOS

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(1)

# Classic-control scripts; later families add theirs here with a cheap env and flags for a few hundred steps.
SMOKE = {
    "ppo.py": ["--env-id", "CartPole-v1", "--total-timesteps", "512", "--num-envs", "4", "--num-steps", "32",
               "--update-epochs", "2", "--eval-episodes", "2"],
    "dqn.py": ["--env-id", "CartPole-v1", "--total-timesteps", "600", "--learning-starts", "200",
               "--batch-size", "32", "--eval-episodes", "2"],
}
SCRIPTS = sorted(p.name for p in ALGOS.glob("*.py"))


@pytest.fixture(params=sorted(SMOKE))
def smoke_script(request):
    return request.param
