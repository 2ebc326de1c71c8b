"""The parent's side of the math-verify worker: start it, ask it, bound each check, retry once on its death.

`Grader` (`drmas_envs.math.grading`) owns one `WorkerClient`; the protocol is `_grade_worker`'s. A check may
use `timeout_s` seconds of the worker's CPU time (read from /proc while waiting); a worker that overruns
is killed and the check is over budget. A worker that dies mid-check (killed from outside, out of memory)
is restarted and the check asked again once; a second death is an error.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger("drmas_envs.math.grading")

_POLL_S = 0.25
"""How often a waiting check reads the worker's CPU time, in seconds."""
_WORKER_SHARE = 0.5
"""The worker ends a check itself after this share of `timeout_s` (no restart); the kill is the backstop."""
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""Put first on the worker's path, so that it imports this very drmas_envs, whatever the caller did to sys.path."""


class WorkerStartError(RuntimeError):
    """The worker did not start or failed its self-check."""


class WorkerClient:
    """One math-verify worker process, asked one check at a time (a lock serialises threads; a forked
    child starts its own worker). `stats` counts `timeouts` (kills at the bound), `retries` and `deaths`.
    """

    def __init__(self, grader):
        self.grader = grader  # timeout_s, wall_timeout_s, startup_timeout_s are read from it at each check
        self.stats = {"timeouts": 0, "retries": 0, "deaths": 0}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._buf = b""
        self._ready = False

    @property
    def worker_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ask(self, request: dict) -> tuple[str, str]:
        """(outcome, why) of one request: the worker's reply, over_budget at the bound, error on a second death.

        Raises:
            WorkerStartError: a first start of the worker failed (math-verify missing or broken).

        """
        if self._pid != os.getpid():  # forked: the worker and lock belong to the parent process
            self._pid, self._proc, self._lock, self._buf, self._ready = os.getpid(), None, threading.Lock(), b"", False
        request = {**request, "cpu_s": _WORKER_SHARE * self.grader.timeout_s}
        with self._lock:
            for attempt in (1, 2):
                try:
                    self._ensure_started()
                except WorkerStartError as exc:
                    if attempt == 1:
                        raise
                    return self._died(f"the grading worker died twice in one check; {exc}")
                try:
                    self._proc.stdin.write((json.dumps(request) + "\n").encode())
                    self._proc.stdin.flush()
                    reply = json.loads(self._await_reply())
                except TimeoutError:
                    self.stats["timeouts"] += 1
                    logger.info("grading went over its bound; worker restarted (%r)", str(request)[:120])
                    self._restart()
                    return "over_budget", f"killed at the bound of {self.grader.timeout_s:g} CPU seconds"
                except (OSError, EOFError, ValueError) as exc:
                    why = self._death_reason(exc)
                    self._restart()
                    if attempt == 2:
                        return self._died(f"the grading worker died twice in one check ({why})")
                    self.stats["retries"] += 1
                    logger.warning("grading worker died mid-check (%s); restarted, asking once more", why)
                    continue
                outcome = reply.get("outcome") if isinstance(reply, dict) else None
                if outcome not in ("right", "wrong", "over_budget", "error"):
                    return "error", f"the grading worker replied {str(reply)[:120]!r}"
                return outcome, str(reply.get("error", ""))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            self._kill()

    # -- internals --------------------------------------------------------------------------------
    def _died(self, why: str) -> tuple[str, str]:
        self.stats["deaths"] += 1
        logger.warning("%s; the check is an error", why)
        return "error", why

    def _death_reason(self, exc: BaseException) -> str:
        code = self._proc.poll() if self._proc is not None else None
        if code is None and self._proc is not None:
            try:
                code = self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
        if code is not None and code < 0:
            return f"killed by signal {-code}"
        return f"exit status {code}" if code is not None else f"{type(exc).__name__}: {exc}"

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "drmas_envs.math._grade_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=env,
        )
        self._buf = b""
        self._ready = False

    def _ensure_started(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._spawn()
        if self._ready:
            return
        try:
            line = self._readline(time.monotonic() + self.grader.startup_timeout_s)
        except (TimeoutError, EOFError) as exc:
            status = self._death_reason(exc) if isinstance(exc, EOFError) else "no answer"
            self._kill()
            raise WorkerStartError(
                f"the math-verify grading worker did not start ({status}); check that `python -m "
                "drmas_envs.math._grade_worker` runs (is math-verify installed?)"
            ) from exc
        try:
            hello = json.loads(line)
        except ValueError:
            hello = {}
        if not isinstance(hello, dict) or not hello.get("ready"):
            self._kill()
            reason = hello.get("error") if isinstance(hello, dict) and hello.get("error") else line[:200]
            raise WorkerStartError(f"the math-verify grading worker failed its self-check: {reason!r}")
        self._ready = True

    def _await_reply(self) -> bytes:
        """The worker's reply; TimeoutError once the check used `timeout_s` of its CPU or `wall_timeout_s`."""
        pid = self._proc.pid
        timeout_s = self.grader.timeout_s
        start = _cpu_seconds(pid)
        if start is None:  # the worker's CPU time cannot be read here: wall time instead
            return self._readline(time.monotonic() + timeout_s)
        wall_end = time.monotonic() + self.grader.wall_timeout_s
        while True:
            try:
                return self._readline(min(wall_end, time.monotonic() + _POLL_S))
            except TimeoutError:
                used = _cpu_seconds(pid)
                if time.monotonic() >= wall_end or used is None or used - start >= timeout_s:
                    raise

    def _readline(self, deadline: float) -> bytes:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("grading worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def _restart(self) -> None:
        self._kill()
        self._spawn()  # start importing now, so the next check does not wait for it


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used (Linux /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
