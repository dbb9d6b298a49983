"""The runs of a suite as Ray tasks (benchmark/run.py --backend ray): on a local Ray started here,
or with an address on an existing cluster (`ray start --head` on one machine, `ray start --address
<head>:<port>` on others).

Code: the job's runtime_env ships the repository root as the driver has it (uncommitted changes
included, which is what the report's commit line describes), less EXCLUDES, to every worker as its
working directory. Not the installed package: pyproject installs only smac_lite, not algos/ and
benchmark/, and a cluster's installed copy could be another commit. The Python environment (torch,
gymnasium, ...) is each node's own: install the pinned dependencies there.
Results: a task runs its script in a temporary directory on its worker and returns that run
directory's files (metrics.csv, config.json, output.log, checkpoints) as bytes; the driver writes
them under its own run directory, so resuming and the report work when the workers are other
machines. Resuming is decided on the driver: a run finished there is not sent at all.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmark.runs import (
    ROOT,
    Outcome,
    RunSpec,
    Unreachable,
    execute,
    keep_or_clear,
    load_script,
    pack_dir,
    unpack_dir,
)

# what workers do not need: run outputs, environments, history, reports (gitignore syntax, relative
# to ROOT)
EXCLUDES = [
    "runs/",
    ".venv/",
    ".ci/venv/",
    ".git/",
    "benchmark/reports/",
    "wandb/",
    "videos/",
    "__pycache__/",
    "*.egg-info/",
    ".pytest_cache/",
]
# seconds; ray.init itself retries for a minute or more before giving up on an address
CONNECT_TIMEOUT = 5.0


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise Unreachable (one line) unless the address's host:port accepts a connection and answers
    as a Ray head (ray.init retries for minutes against a port that speaks another protocol, an HTTP
    server): impala.py's own check_ray_address, whose one-line error becomes Unreachable here."""
    impala = load_script("impala.py")

    def unreachable(message: str, *scripts: str):
        raise Unreachable(message)

    impala.fail = unreachable  # check_ray_address looks fail() up in its module when it calls it
    impala.check_ray_address(address, timeout)


def _run_on_worker(
    spec: RunSpec, device: str, timeout: float | None
) -> tuple[Outcome, dict[str, bytes]]:
    """On a worker: run spec in a fresh temporary directory; its Outcome and the run directory's
    files."""
    with tempfile.TemporaryDirectory(prefix="canonrl-run-") as tmp:
        outcome = execute(spec, Path(tmp) / spec.name, device, timeout)
        return outcome, pack_dir(outcome.run_dir)


def token_available() -> bool:
    """Whether a Ray auth token is where `ray start` looks for one."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(path).is_file()


def _init(ray, address: str | None, jobs: int) -> None:
    runtime_env = {"working_dir": str(ROOT), "excludes": EXCLUDES}
    quiet = dict(log_to_driver=False, configure_logging=False)
    if address is None:
        # "local": a new Ray of `jobs` CPUs here, even where RAY_ADDRESS or an earlier `ray start`
        # names another
        ray.init(
            address="local",
            num_cpus=jobs,
            include_dashboard=False,
            runtime_env=runtime_env,
            **quiet,
        )
        return
    check_reachable(address)
    try:  # an existing cluster brings its own resources: ray.init refuses num_cpus with an address
        ray.init(address=address, runtime_env=runtime_env, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise Unreachable(
            f"cannot join the Ray cluster at {address}: {str(e).strip().splitlines()[0]}"
        ) from None


def execute_all(
    items,
    device: str = "cpu",
    jobs: int = 1,
    timeout: float | None = None,
    address: str | None = None,
):
    """Yield the Outcome of each (spec, run_dir) of items as it ends, run_dir on this machine. One
    CPU per task and, on cuda, 1/jobs of a GPU. Ray is started (or joined) here unless it already
    is, and shut down after."""
    # `ray start` turns token authentication on when it finds a token (RAY_AUTH_TOKEN,
    # RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), but ray.init with an explicit address does not (Ray
    # 2.60), and the cluster then refuses the driver (InvalidAuthToken). Send the token wherever
    # `ray start` would find one, unless RAY_AUTH_MODE says otherwise; Ray reads the mode when it is
    # imported, so this comes first.
    if address is not None and "RAY_AUTH_MODE" not in os.environ and token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    todo = []
    for spec, run_dir in items:
        if keep_or_clear(Path(run_dir)):
            yield Outcome(spec, Path(run_dir), "done")
        else:
            todo.append((spec, Path(run_dir)))
    if not todo:
        return
    started = not ray.is_initialized()
    if started:
        _init(ray, address, jobs)
    try:
        task = ray.remote(num_cpus=1, num_gpus=1 / jobs if device == "cuda" else 0)(_run_on_worker)
        pending = {task.remote(spec, device, timeout): (spec, run_dir) for spec, run_dir in todo}
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            yield _receive(ray, ref, *pending.pop(ref))
    finally:
        if started:
            ray.shutdown()


def _receive(ray, ref, spec: RunSpec, run_dir: Path) -> Outcome:
    """Write a finished task's run directory under run_dir; a task that Ray itself lost is a failed
    run."""
    try:
        outcome, files = ray.get(ref)
    except ray.exceptions.RayError as e:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "output.log").write_text(str(e))
        return Outcome(spec, run_dir, "failed", error=f"Ray task failed: {type(e).__name__}")
    unpack_dir(run_dir, files)
    outcome.run_dir = run_dir
    return outcome


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def separate_cluster(num_cpus: int = 2):
    """A Ray cluster of its own in a separate process (`ray start --head --block`, its own temp dir
    and ports), as a remote cluster would be: yields its address, the environment a driver needs
    (its auth token) and the head's pid, which is the session id of every process the cluster
    starts. Ended by SIGTERM to that process, which stops the processes it started, then by killing
    what is left of its session by pid. Not `ray stop`: that stops every Ray process of the user on
    this machine, other people's clusters and local Rays included."""
    # Ray ships psutil in its thirdparty_files, which importing ray puts on the path: ray first
    import ray  # noqa: F401

    # isort: split
    import psutil

    # its own: Ray keeps sockets and logs there, not in the shared default
    tmp = Path(tempfile.mkdtemp(prefix="ray"))
    port = free_port()
    # its own token too (Ray checks one on every connection): the cluster and the driver read this
    # file, never the user's ~/.ray/auth_token, which another Ray on the machine may write meanwhile
    (tmp / "auth_token").write_text(uuid.uuid4().hex * 2)
    env = {**os.environ, "RAY_AUTH_TOKEN_PATH": str(tmp / "auth_token")}
    log = open(tmp / "start.log", "w")
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        str(num_cpus),
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--temp-dir",
        str(tmp),
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]
    head = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in (tmp / "start.log").read_text():
            if head.poll() is not None or time.time() > deadline:
                raise RuntimeError("ray start failed: " + (tmp / "start.log").read_text()[-3000:])
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", env, head.pid
    finally:
        head.terminate()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        for proc in psutil.process_iter():
            try:
                # the session start_new_session made: only what we started
                if os.getsid(proc.pid) == head.pid:
                    proc.kill()
            except (OSError, psutil.Error):
                pass
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
