"""Run an algos/ script as a subprocess (a fresh process, or a child forked from a parent that has
already imported torch and the rest) and read what it left behind."""

import argparse
import csv
import json
import locale
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"


def script_path(script: str) -> Path:
    """algos/<script>. `script` may come from a file someone else wrote (a run's config.json): only
    the bare name of a file in algos/ is accepted, never a path, so that no file outside algos/ is
    ever run or imported."""
    if not isinstance(script, str) or not re.fullmatch(r"[A-Za-z0-9_]+\.py", script):
        raise FileNotFoundError(
            f"{script!r} is not the name of a script of algos/ (such as ppo.py)"
        )
    path = ALGOS / script
    if not path.is_file():
        raise FileNotFoundError(f"no script {script} in {ALGOS}")
    return path


def run_env(**extra) -> dict:
    """The environment a script runs under: one torch thread, wandb offline, plus `extra`."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        **extra,
    }


def script_command(script: str, flags: list[str], run_dir: Path | str | None) -> list[str]:
    """The command line of algos/<script>; "sb3:<script>" is SB3 with that script's hyperparameters
    (benchmark/sb3_baseline.py), "d3rlpy:<script>" d3rlpy with an offline script's
    (benchmark/d3rlpy_baseline.py), "trl:<script>" TRL with an LM script's
    (benchmark/trl_baseline.py), "imitation:<script>" the imitation library with gail.py's
    (benchmark/imitation_baseline.py)."""
    if script.startswith(("sb3:", "d3rlpy:", "trl:", "imitation:")):
        peer, ours = script.split(":")
        script_path(ours)
        cmd = [
            sys.executable,
            str(ROOT / "benchmark" / f"{peer}_baseline.py"),
            "--same-as",
            ours,
            *flags,
        ]
    else:
        cmd = [sys.executable, str(script_path(script)), *flags]
    return cmd + (["--run-dir", str(run_dir)] if run_dir is not None else [])


def run_script(
    script: str,
    flags: list[str],
    run_dir: Path | str | None = None,
    timeout: float | None = None,
    cwd: Path | str = ROOT,
    fork: bool = False,
    **env,
) -> subprocess.CompletedProcess:
    """Run `python algos/<script> <flags> --run-dir <run_dir>` in `cwd` with the extra environment
    variables `env`; stdout and stderr are captured as text. fork=True: the run is a child of this
    process's fork server (see start_script), the same run without the seconds of start-up; a
    timeout kills the run and raises TimeoutExpired either way."""
    if not fork:
        return subprocess.run(
            script_command(script, flags, run_dir),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=run_env(**env),
        )
    proc = start_script(script, flags, run_dir, cwd=cwd, fork=True, **env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def start_script(
    script: str,
    flags: list[str],
    run_dir: Path | str | None = None,
    cwd: Path | str = ROOT,
    fork: bool = False,
    **env,
):
    """Start algos/<script> without waiting for it: a subprocess.Popen (fork=False), or a
    ForkedProcess (fork=True), which has the same pid, poll, wait, send_signal, terminate, kill,
    communicate and returncode. stdout and stderr come back as text from communicate(). SIGINT is
    Python's default in the run (Ctrl-C raises KeyboardInterrupt), even where the shell that started
    the tests ignores it."""
    cmd, env = script_command(script, flags, run_dir), run_env(**env)
    if fork:
        return fork_server().start(cmd, cwd, env)
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _default_sigint():
    # Python then installs its KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- the fork server ----
# Most of a short script run is start-up: importing torch (with torch._dynamo, which the first
# optimizer step imports) and gymnasium costs more than a smoke run's training, and so does exiting
# with torch loaded. The fork server is one process per test worker that has imported these once;
# each run is a child forked from it that runs the script with runpy under the run's argv, working
# directory, environment and file-descriptor-level stdout/stderr, and reports its exit status as a
# fresh process would (SystemExit codes, 1 and a traceback for an uncaught exception, death by
# SIGINT for an uncaught KeyboardInterrupt). What forking cannot give: unseeded random state
# (numpy's, torch's, the hash seed) is the same in every child, so a determinism check needs one
# fresh process; environment variables read at import or at start-up come from the server
# (FORK_IMPORT_ENV and PYTHON* may not differ); the server imports only what a script would import
# anyway and nothing that changes a registry (ale_py registers ALE ids in gymnasium); the imports
# must print nothing (a fresh process would print it on every run) and start no thread (fork keeps
# only the forking thread), or the server refuses to start. CUDA is never initialised in the server.
FORK_PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",
    "torch.utils.tensorboard",
    "gymnasium",
    "tyro",
    "tqdm",
    "gymnasium.envs.mujoco",
    "stable_baselines3.common.atari_wrappers",
    "pettingzoo",
    "mpe2",
    "smac_lite",
    "imageio.v2",
    "envpool",
    "canonrl.run",
)
FORK_IMPORT_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
)
_SERVER, _SERVER_LOCK = None, threading.Lock()


def fork_server() -> "ForkServer":
    """This process's fork server, started on first use (a few seconds: the imports) and stopped at
    exit."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER.proc.poll() is not None:
            _SERVER = ForkServer()
        return _SERVER


class ForkServer:
    """The client side: starts `python benchmark/runs.py --fork-server <modules>` and talks to it in
    JSON lines over its stdin/stdout. Requests: {"run": id, "argv", "cwd", "env", "stdout",
    "stderr"} (answered {"started": id, "pid"}) and {"signal": id, "signum"} (sent by the server
    only while that child is unreaped, so never to a reused pid). The server also sends {"exit": id,
    "returncode"} when a child ends."""

    def __init__(self, preload=FORK_PRELOAD):
        import atexit

        self.log = tempfile.TemporaryFile()  # the server's own stderr, shown if it dies
        self.env = run_env()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--fork-server", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=self.env,
            cwd=ROOT,
        )
        self.lock, self.buffer, self.started, self.exited, self.next_id = (
            threading.Lock(),
            b"",
            {},
            {},
            0,
        )
        atexit.register(self.close)
        with self.lock:
            if not self._receive_until(lambda: "ready" in self.started, timeout=600):
                self.close()
                raise RuntimeError("the fork server did not start within 600 s")
        if problem := self.started.pop("ready"):
            self.close()
            raise RuntimeError(f"the fork server cannot fork script runs: {problem}")

    def _died(self) -> RuntimeError:
        self.log.seek(0)
        return RuntimeError(
            "the fork server died: " + self.log.read().decode(errors="replace")[-3000:]
        )

    def _send(self, message: dict):
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None

    def _receive_until(self, done, timeout: float | None) -> bool:
        """Read the server's messages until done() (True) or the timeout (False). Hold self.lock."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while not done():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return False
            data = os.read(fd, 1 << 16)
            if not data:
                raise self._died()
            self.buffer += data
            *lines, self.buffer = self.buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "exit" in message:
                    self.exited[message["exit"]] = message["returncode"]
                elif "started" in message:
                    self.started[message["started"]] = message["pid"]
                elif "ready" in message:
                    self.started["ready"] = message["problem"]
        return True

    def start(self, cmd: list[str], cwd, env: dict) -> "ForkedProcess":
        changed = [
            k
            for k in sorted(set(env) | set(self.env))
            if (k in FORK_IMPORT_ENV or k.startswith("PYTHON")) and env.get(k) != self.env.get(k)
        ]
        if changed:
            raise ValueError(
                f"{', '.join(changed)} differ from the fork server's and are "
                "read at import: run this script in a fresh process (fork=False)"
            )
        out_dir = tempfile.mkdtemp(prefix="forkrun-")
        with self.lock:
            run_id, self.next_id = self.next_id, self.next_id + 1
            self._send(
                {
                    "run": run_id,
                    "argv": [str(c) for c in cmd],
                    "cwd": str(cwd),
                    "env": env,
                    "stdout": os.path.join(out_dir, "stdout"),
                    "stderr": os.path.join(out_dir, "stderr"),
                }
            )
            self._receive_until(lambda: run_id in self.started, timeout=None)
            pid = self.started.pop(run_id)
        return ForkedProcess(self, cmd, run_id, pid, out_dir)

    def returncode(self, run_id: int, timeout: float | None) -> int | None:
        """The run's exit status once it has ended (within timeout seconds), else None."""
        with self.lock:
            self._receive_until(lambda: run_id in self.exited, timeout)
            return self.exited.pop(run_id, None)

    def signal(self, run_id: int, signum: int):
        with self.lock:
            self._send({"signal": run_id, "signum": int(signum)})

    def close(self):
        """Stop the server: it kills the children still running."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ForkedProcess:
    """A script run forked by the fork server, used like the subprocess.Popen of start_script."""

    def __init__(self, server: ForkServer, args: list[str], run_id: int, pid: int, out_dir: str):
        self.server, self.args, self.run_id, self.pid, self.out_dir = (
            server,
            args,
            run_id,
            pid,
            out_dir,
        )
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.run_id, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.run_id, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int):
        if self.poll() is None:
            self.server.signal(self.run_id, signum)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the run to end; its (stdout, stderr) as text, decoded as subprocess does with
        text=True."""
        self.wait(timeout)
        outputs = []
        for name in ("stdout", "stderr"):
            with open(os.path.join(self.out_dir, name), "rb") as f:
                text = f.read().decode(locale.getpreferredencoding(False))
            outputs.append(text.replace("\r\n", "\n").replace("\r", "\n"))
        shutil.rmtree(self.out_dir, ignore_errors=True)
        return outputs[0], outputs[1]

    def __del__(self):
        shutil.rmtree(self.out_dir, ignore_errors=True)


def _serve(preload: list[str]):
    """The server: import `preload`, then fork one child per run request until stdin closes (the
    client is gone), then kill the children still running."""
    import gc
    import importlib
    import traceback

    # fds 0 and 1 are the protocol; a child gets its own 0, 1 and 2
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    stderr = os.dup(2)
    problem = None
    # what the imports print: a fresh process would print it every run
    with tempfile.TemporaryFile() as printed:
        os.dup2(null, 0)
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        for name in preload:
            try:
                importlib.import_module(name)
            except ImportError:
                # an optional package (envpool): a script that needs it fails as it would fresh
                pass
            except Exception:
                problem = f"importing {name} failed:\n{traceback.format_exc()}"
        sys.stdout.flush()
        sys.stderr.flush()
        printed.seek(0)
        if text := printed.read().decode(errors="replace"):
            problem = (
                problem
                or f"importing {' '.join(preload)} printed (a fresh "
                f"run would print it too):\n{text}"
            )
    os.dup2(stderr, 1)
    os.dup2(stderr, 2)
    os.close(stderr)
    if (
        threads := len(os.listdir("/proc/self/task"))
        if os.path.isdir("/proc/self/task")
        else threading.active_count()
    ) > 1:
        problem = (
            problem
            or f"importing {' '.join(preload)} started {threads - 1} threads, which a fork loses"
        )

    def reply(message: dict):
        os.write(replies, json.dumps(message).encode() + b"\n")

    reply({"ready": True, "problem": problem})
    if problem:
        return
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    # the terminal's Ctrl-C: the server goes when its client goes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    live, buffer = {}, b""  # {pid: run id} of the children not reaped yet
    while True:
        ready = select.select([requests, wake_read], [], [])[0]
        if wake_read in ready:
            while True:
                try:
                    os.read(wake_read, 4096)
                except BlockingIOError:
                    break
        while live:  # reap every child that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            reply({"exit": live.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})
        if requests not in ready:
            continue
        data = os.read(requests, 1 << 16)
        if not data:
            for pid in live:
                os.kill(pid, signal.SIGKILL)
            return
        *lines, buffer = (buffer + data).split(b"\n")
        for line in lines:
            request = json.loads(line)
            if "signal" in request:
                for pid in [pid for pid, run_id in live.items() if run_id == request["signal"]]:
                    os.kill(pid, request["signum"])
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            # the server's objects stay out of the children's garbage collections (which would copy
            # them)
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                _child(request, close=(requests, replies, null, wake_read, wake_write))
            live[pid] = request["run"]
            reply({"started": request["run"], "pid": pid})


def _script_traceback(e: BaseException, script: str):
    """The traceback of e from the script's frames on, without _child's and runpy's, as a fresh
    process prints it."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb or e.__traceback__


def _child(request: dict, close: tuple):
    """A forked run: `python <argv[1]> <argv[2:]>` as a fresh interpreter would run it, then
    os._exit."""
    code, interrupted = 1, False
    try:
        import atexit
        import gc
        import runpy

        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in close:
            os.close(fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out = os.open(request["stdout"], flags, 0o644)
        err = (
            out
            if request["stderr"] == request["stdout"]
            else os.open(request["stderr"], flags, 0o644)
        )
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, out, err}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][1]
        sys.argv = request["argv"][1:]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:  # as Python's handle_system_exit
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt as e:  # Python prints the traceback, then dies of SIGINT
            sys.excepthook(type(e), e, e.with_traceback(_script_traceback(e, script)).__traceback__)
            interrupted = True
        except BaseException as e:
            sys.excepthook(type(e), e, e.with_traceback(_script_traceback(e, script)).__traceback__)
            code = 1
        # the rest of an interpreter's exit: join non-daemon threads, run atexit functions, collect
        # garbage (its __del__ methods close files), flush stdout and stderr
        threading._shutdown()
        atexit._run_exitfuncs()
        gc.collect()
    except BaseException:
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def read_rows(run_dir: Path | str) -> list[dict]:
    """metrics.csv as a list of rows {global_step, wall_time, name, value}."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [
            {
                "global_step": int(r["global_step"]),
                "wall_time": float(r["wall_time"]),
                "name": r["name"],
                "value": float(r["value"]),
            }
            for r in csv.DictReader(f)
        ]


def tail_rows(path: Path, offset: int, rows: list) -> int:
    """Append the complete rows written to metrics.csv after byte `offset` to `rows`; returns the
    new offset. For watching a run while it goes: reading only what is new costs little CPU."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.decode().splitlines():
        step, wall, name, value = line.split(",")
        if step != "global_step":
            rows.append(
                {
                    "global_step": int(step),
                    "wall_time": float(wall),
                    "name": name,
                    "value": float(value),
                }
            )
    return offset + len(complete)


def read_metrics(run_dir: Path | str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """metrics.csv as {name: (global_steps, values)} in the order they were logged."""
    series = defaultdict(lambda: ([], []))
    for row in read_rows(run_dir):
        series[row["name"]][0].append(row["global_step"])
        series[row["name"]][1].append(row["value"])
    return {
        k: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
        for k, (s, v) in series.items()
    }


class OneLineParser(argparse.ArgumentParser):
    """argparse with bad input said as the scripts say it: one line `error: ...` on stderr, exit
    status 2 (no usage block before it; --help shows the usage)."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_baseline_args(doc: str, same: dict, peer: str, argv=None, offline: bool = False):
    """The command line of a peer's run (benchmark/sb3_baseline.py, d3rlpy_baseline.py): --same-as
    <our script> and the run's flags, then any flag of that script (e.g. --batch-size 256), set on
    its Args' defaults. Returns (parser, the run's flags, our script's Args)."""
    p = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--same-as",
        required=True,
        choices=sorted(same),
        help="our script whose hyperparameters to use",
    )
    p.add_argument(
        "--env-id",
        required=True,
        help="the env to evaluate in (the dataset's)" if offline else None,
    )
    p.add_argument(
        "--total-timesteps", type=int, required=True, help="gradient steps" if offline else None
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also evaluate every this many steps (0: only at the end)",
    )
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument(
        "--run-dir",
        type=Path,
        required=True,
        help="a new directory for config.json and metrics.csv",
    )
    p.add_argument(
        "--cuda",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run on CUDA when available (SB3; d3rlpy_baseline.py ignores it: the CPU)",
    )
    a, rest = p.parse_known_args(argv)
    ours = load_script(a.same_as).Args()
    rest = list(rest)
    while rest:
        flag = rest.pop(0)
        name = flag.removeprefix("--").replace("-", "_")
        if not flag.startswith("--"):
            p.error(f"{a.same_as} has no flag {flag}")
        # a switch as tyro writes it: --norm-reward sets it, --no-norm-reward clears it
        if isinstance(getattr(ours, name, None), bool):
            setattr(ours, name, True)
            continue
        if name.startswith("no_") and isinstance(getattr(ours, name[3:], None), bool):
            setattr(ours, name[3:], False)
            continue
        if not hasattr(ours, name):
            p.error(f"{a.same_as} has no flag {flag}")
        if not rest:
            p.error(f"flag {flag} needs a value")
        value = rest.pop(0)
        default = getattr(ours, name)
        if default is not None and not isinstance(default, str):
            value = type(default)(value)
        setattr(ours, name, value)
    if a.run_dir.exists():
        p.error(f"--run-dir {a.run_dir} exists; give a new directory")
    return p, a, ours


def baseline_run_args(a, ours, **extra) -> dict:
    """The "args" a peer's run records in its config.json: our script's Args with the run's flags
    (env, budget, seed, evaluation schedule, run directory) and `extra` over them, so that
    run_finished and a resumed suite read it as they read ours."""
    return {
        **vars(ours),
        "env_id": a.env_id,
        "total_timesteps": a.total_timesteps,
        "seed": a.seed,
        "eval_every": a.eval_every,
        "eval_episodes": a.eval_episodes,
        **extra,
        "run_dir": str(a.run_dir),
    }


def print_baseline_end(returns: list[float], run_dir: Path, what: str):
    """The last lines of a peer's run (benchmark/sb3_baseline.py, d3rlpy_baseline.py): its final
    evaluation, where the run is."""
    if returns:
        print(f"eval/episodic_return: {np.mean(returns):.2f} over {len(returns)} episodes ({what})")
    print(f"run saved in {run_dir}")


def file_stem(script: str) -> str:
    """A script's name for file names: "ppo.py" -> "ppo", "sb3:sac_continuous.py" ->
    "sb3-sac_continuous"."""
    return script.removesuffix(".py").replace(":", "-")


def load_script(script: str):
    """Import algos/<script> as a module (its main() does not run): its Args defaults, functions,
    classes."""
    import importlib.util

    path = script_path(script)  # a bare name of algos/ only: never a file that a run folder names
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_finished(run_dir: Path | str) -> bool:
    """True when the run logged its final evaluation: eval/episodic_return(_team) rows (at least
    --eval-episodes of them) at the last step of training. Training ends at the largest multiple of
    the step granularity (num_envs * num_steps for rollout scripts, num_envs otherwise) not above
    total_timesteps, and evaluations during training (--eval-every) happen at least one granularity
    earlier, so they never pass for the final one."""
    import json

    run_dir = Path(run_dir)
    try:
        args = json.loads((run_dir / "config.json").read_text())["args"]
        rows = read_rows(run_dir)
    except (OSError, ValueError, KeyError):
        return False
    if not rows or args.get("eval_episodes", 1) < 1:
        return False
    last = max(r["global_step"] for r in rows)
    granularity = args.get("num_envs", 1) * args.get("num_steps", 1)
    # _team too
    evals = sum(
        r["name"].startswith("eval/episodic_return") and r["global_step"] == last for r in rows
    )
    return evals >= args.get("eval_episodes", 1) and last > args["total_timesteps"] - granularity


def pack_dir(run_dir: Path | str) -> dict[str, bytes]:
    """Every file under run_dir as {path relative to it: bytes}: how a run made on another machine
    comes back."""
    run_dir = Path(run_dir)
    return {
        p.relative_to(run_dir).as_posix(): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def unpack_dir(run_dir: Path | str, files: dict[str, bytes]) -> None:
    """Write pack_dir's files under run_dir."""
    for rel, data in files.items():
        path = Path(run_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def git_head() -> tuple[str, list[str]]:
    """The short commit of this checkout ("unknown" outside git) and its tracked files with
    uncommitted changes (the reports do not count: a report's own run rewrites their index)."""

    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmark/reports")
    return git("rev-parse", "--short", "HEAD") or "unknown", [
        ln.split(maxsplit=1)[1] for ln in dirty.splitlines()
    ]


def git_commit() -> str:
    """The short commit of this checkout, saying so when tracked files have uncommitted changes."""
    commit, dirty = git_head()
    return commit + (" with uncommitted changes to " + ", ".join(dirty) if dirty else "")


if __name__ == "__main__" and sys.argv[1:2] == ["--fork-server"]:
    _serve(sys.argv[2:])


# ---- one run of a suite (benchmark/run.py, benchmark/ray_backend.py) ----


@dataclass(frozen=True)
class RunSpec:
    """One run of a suite: a script on an env with a seed, budget and extra flags, and how it is
    scored."""

    script: str
    env_id: str
    seed: int
    total_timesteps: int
    score: str
    flags: tuple[str, ...] = ()
    # a reference id, or None: the matching one (benchmark.references.find_reference)
    reference: str | None = None
    # the reference is made from this entry's runs: reported, not judged
    self_reference: bool = False
    # also judged against the runs of these scripts ("sb3:sac_continuous.py")
    compare_with: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{file_stem(self.script)}__{self.env_id.replace('/', '-')}__{self.seed}"

    def command_flags(self, device: str) -> list[str]:
        return [
            "--env-id",
            self.env_id,
            "--total-timesteps",
            str(self.total_timesteps),
            "--seed",
            str(self.seed),
            *self.flags,
            "--cuda" if device == "cuda" else "--no-cuda",
        ]


class Unreachable(RuntimeError):
    """The Ray cluster of --ray-address cannot be reached or joined (benchmark/ray_backend.py)."""


@dataclass
class Outcome:
    spec: RunSpec
    run_dir: Path
    # "done" (finished before, kept), "ok" (ran and finished), "failed", "reported" (an earlier
    # report's)
    status: str
    seconds: float = 0.0
    error: str = ""
    # status "reported": the score, final eval and eval curve that report gives the seed
    reported: dict | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "ok", "reported")


def _error_line(stderr: str, returncode: int) -> str:
    """The line of a crashed run's output that says why (tracebacks end with it; tyro boxes its
    message)."""
    lines = [ln.strip(" │╭╮╰╯─┃━\t") for ln in re.split(r"[\r\n]+", stderr)]
    lines = [ln for ln in lines if ln and "it/s]" not in ln and "step/s]" not in ln]
    flagged = [ln for ln in lines if re.search(r"error|exception|unrecognized|invalid", ln, re.I)]
    return f"exit {returncode}: " + ((flagged or lines or ["(no output)"])[-1])[:300]


def not_a_run(run_dir: Path) -> bool:
    """True when run_dir holds files that no run of a script or of the benchmark wrote (no
    config.json naming a script, no output.log): a folder of someone's, never deleted."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return run_dir.exists() and not run_dir.is_dir()
    if (run_dir / "output.log").is_file():
        return False
    try:
        return not isinstance(json.loads((run_dir / "config.json").read_text())["script"], str)
    except (OSError, ValueError, KeyError, TypeError):
        return True


def keep_or_clear(run_dir: Path) -> bool:
    """True when run_dir holds its run finished (kept); otherwise deletes what a half-done run left
    there. A folder that holds no run (not_a_run) is never deleted: ValueError."""
    if run_finished(run_dir):
        return True
    if not_a_run(run_dir):
        raise ValueError(f"{run_dir} holds files that are not a run; it is left as it is")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return False


def resumable(spec: RunSpec, run_dir: Path, device: str) -> bool:
    """True when a half-done run_dir holds a checkpoint of this very run: config.json names the
    spec's script, and every flag of its command line (env, budget, seed, the suite's flags, the
    device) has the value the run was started with."""
    try:
        config = json.loads((run_dir / "config.json").read_text())
        saved = config["args"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    from canonrl.run import flag_values, same_value  # (torch: imported only when needed)

    flags = flag_values(spec.command_flags(device))
    if flags is None or not (run_dir / "checkpoint.pt").is_file():
        return False
    if config.get("script") != spec.script or not isinstance(saved, dict):
        return False
    for name, tokens in flags.items():
        if name not in saved:
            return False
        value = saved[name]
        values = value if isinstance(value, list) else [value]
        if len(values) != len(tokens):
            return False
        if not all(same_value(t, v) for t, v in zip(tokens, values)):
            return False
    return True


def _run(script: str, flags: list[str], run_dir: Path | None, timeout: float | None):
    """(stdout, stderr, exit status) of one script run; a timeout is exit status 124."""
    try:
        out = run_script(script, flags, run_dir, timeout=timeout)
        return out.stdout, out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        return (
            str(e.stdout or ""),
            str(e.stderr or "") + f"\nerror: timed out after {timeout} s",
            124,
        )


def execute(
    spec: RunSpec, run_dir: Path, device: str = "cpu", timeout: float | None = None
) -> Outcome:
    """Run one spec unless run_dir already holds it finished. A half-done run_dir that holds a
    checkpoint of this run (killed, or Ctrl-C) goes on from it with the script's --resume; one that
    cannot resume (no checkpoint, other flags, a checkpoint the script refuses) is deleted and the
    run redone from the start. output.log keeps what each attempt printed."""
    run_dir = Path(run_dir)
    if run_finished(run_dir):
        return Outcome(spec, run_dir, "done")
    start = time.time()
    log = ""
    if resumable(spec, run_dir, device):
        earlier = run_dir / "output.log"
        log = earlier.read_text(errors="replace") if earlier.is_file() else ""
        stdout, stderr, rc = _run(spec.script, ["--resume", str(run_dir)], None, timeout)
        log += f"\n--- resumed from {run_dir / 'checkpoint.pt'} ---\n" + stdout + stderr
        if rc == 0 and run_finished(run_dir):
            (run_dir / "output.log").write_text(log)
            return Outcome(spec, run_dir, "ok", time.time() - start)
        if rc == 124:
            (run_dir / "output.log").write_text(log)
            error = _error_line(stderr, rc)
            return Outcome(spec, run_dir, "failed", time.time() - start, error)
        log += "\n--- the resume failed: the run is redone from the start ---\n"
    keep_or_clear(run_dir)
    stdout, stderr, rc = _run(spec.script, spec.command_flags(device), run_dir, timeout)
    seconds = time.time() - start
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "output.log").write_text(log + stdout + stderr)
    if rc == 0 and run_finished(run_dir):
        return Outcome(spec, run_dir, "ok", seconds)
    error = (
        _error_line(stderr, rc) if rc else "exit 0 but no final eval/episodic_return in metrics.csv"
    )
    return Outcome(spec, run_dir, "failed", seconds, error)
