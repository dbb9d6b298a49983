"""Several processes of one script under torchrun: the ranks' part of the run contract.

    torchrun --standalone --nproc_per_node=2 algos/grpo_lm.py ...

torchrun starts one process (a rank) per GPU, or per CPU worker, and describes the job in each one's
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Without torchrun a script is
one process and every method here is a no-op. What is the algorithm's stays in the script: which
part of a batch a rank computes, and which sums make its step the step of one process on the whole
batch. What is here is the same for every script: joining the process group (NCCL between GPUs,
gloo between CPU processes), sums and means over the ranks, the gradients summed or averaged before
the optimiser's step, a check that every rank holds the same weights, and rank 0 alone writing the
run directory (the others hold a QuietLogger, which logs, evaluates and saves nothing) while a
Ctrl-C that reaches any rank stops every rank after the same iteration.
"""

import contextlib
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from canonrl.run import RunLogger, stop_at_reached


class Ranks:
    """The processes of this job, as torchrun's environment describes them; one process without
    it."""

    def __init__(self):
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.collectives_device = torch.device("cpu")  # where NCCL's tensors must be: the GPU

    @contextlib.contextmanager
    def said_by_rank_0(self):
        """Drop what the block prints on ranks other than 0: every rank parses and checks the
        flags and stops on bad ones, and one copy of the message is enough. A traceback is still
        printed on every rank."""
        if self.rank == 0:
            yield
            return
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull),
            contextlib.redirect_stderr(devnull),
        ):
            yield

    def device(self, cuda: bool) -> torch.device:
        """This rank's GPU (cuda:LOCAL_RANK) with --cuda where there is one, else the CPU."""
        if cuda and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def join(self, device: torch.device):
        """Join the process group (NCCL between GPUs, gloo between CPU processes). The barrier: no
        rank writes the run directory before every rank has checked it (start_run)."""
        if self.world_size == 1:
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.collectives_device = device
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            device_id=device if device.type == "cuda" else None,
        )
        dist.barrier()

    def leave(self):
        """The end of the collectives: the barrier keeps a rank from tearing the group down while
        another is still in the last all-reduce (gloo aborts it then)."""
        if self.world_size > 1:
            dist.barrier()
            dist.destroy_process_group()

    def share(self, n: int) -> slice:
        """This rank's part of n items (n a multiple of world_size): rank r takes the r-th of
        world_size equal, consecutive parts."""
        size = n // self.world_size
        return slice(self.rank * size, (self.rank + 1) * size)

    def sum(self, x) -> torch.Tensor:
        """x (a tensor or a number) summed over the ranks (one all-reduce; the result on this
        rank's device); x itself in one process."""
        if self.world_size == 1:
            return torch.as_tensor(x)
        x = torch.as_tensor(x, device=self.collectives_device).clone()
        dist.all_reduce(x)
        return x

    def mean(self, x) -> torch.Tensor:
        """x averaged over the ranks."""
        return self.sum(x) / self.world_size

    def sum_of(self, values: dict) -> dict:
        """Each value of `values` (numbers, or tensors of one element) summed over the ranks, as
        floats (one all-reduce of them all)."""
        if self.world_size == 1:
            return {k: float(v) for k, v in values.items()}
        x = torch.tensor([float(v) for v in values.values()], dtype=torch.float64)
        return dict(zip(values, self.sum(x).tolist()))

    def mean_of(self, values: dict) -> dict:
        """Each value of `values` averaged over the ranks, as floats."""
        return {k: v / self.world_size for k, v in self.sum_of(values).items()}

    def max(self, x) -> torch.Tensor:
        """The largest x of any rank."""
        if self.world_size == 1:
            return torch.as_tensor(x)
        x = torch.as_tensor(x, device=self.collectives_device).clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x

    def reduce_gradients(self, params, average: bool = True):
        """Replace every rank's gradients by their mean (average) or their sum over the ranks, with
        one all-reduce of them all, flattened; a parameter with no gradient on a rank (it computed
        nothing this step) counts as zeros. This is what DistributedDataParallel computes (in
        buckets, overlapped with the backward pass); an explicit all-reduce keeps the scripts'
        networks and their methods as in one process (DDP syncs only through forward())."""
        if self.world_size == 1:
            return
        params = list(params)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = self.sum(torch.cat([p.grad.flatten() for p in params]))
        if average:
            flat /= self.world_size
        for p, value in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(value.view_as(p.grad))

    def check_same_weights(self, *modules: nn.Module):
        """Raise unless every rank holds bit-identical parameters (64 bits of a SHA-256 of their
        bytes, gathered)."""
        if self.world_size == 1:
            return
        digest = hashlib.sha256(
            b"".join(p.detach().cpu().numpy().tobytes() for m in modules for p in m.parameters())
        ).digest()
        device = next(modules[0].parameters()).device
        mine = torch.tensor(int.from_bytes(digest[:8], "little", signed=True), device=device)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        if any(d != mine for d in every):
            raise RuntimeError(
                f"the ranks hold different weights (rank {self.rank}: {mine.item():x}); a "
                "rank resumed from another checkpoint, or the ranks' hardware computes differently"
            )

    def logger(self, args, run_dir, total: int, step: int, ckpt, script: str):
        """The run's RunLogger (these arguments) on rank 0, which alone writes the run directory;
        a QuietLogger on the others."""
        if self.rank == 0:
            return RunLogger(args, run_dir, total, step, ckpt, script)
        return QuietLogger(args, total)

    def agree_to_stop(self, logger):
        """A Ctrl-C that reached any rank (torchrun passes it to every one, not quite at once)
        stops every rank after this iteration: the logger's stop_requested becomes the same on
        all."""
        if self.world_size > 1:
            logger.stop_requested = bool(self.max(float(logger.stop_requested)) > 0)


class QuietLogger:
    """What ranks other than 0 hold in place of the RunLogger: they log, evaluate and save nothing
    (rank 0 does so for the run). A Ctrl-C that reaches one of them stops the run as on rank 0
    (Ranks.agree_to_stop)."""

    def __init__(self, args, total: int):
        self.args = args
        self.total = total
        self.stop_requested = False
        self.last_return = float("nan")
        self.eval_seconds = 0.0
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_):
        self.stop_requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once

    def log(self, *args, **kwargs):  # and the rest: nothing to write
        pass

    log_episode = progress = save_checkpoint = close = log

    def evaluate(self, step: int, run_episodes):
        return []

    def stops_after(self, step: int) -> bool:
        return self.stop_requested or stop_at_reached(self.args, step, self.total)

    def end_iteration(self, stateful, iteration, step, run_eval=None):
        if self.stops_after(step):
            self.exit_stopped(step)

    def finish(self, stateful, iteration, step, run_eval=None, model=None, save_also=None):
        return {}

    def exit_stopped(self, step: int):
        sys.exit(130 if self.stop_requested else 0)
