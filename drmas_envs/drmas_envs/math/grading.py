r"""Grading: is an extracted answer mathematically equivalent to the reference?

Two paths, both bounded in time:

1. A fast path in this process: normalised string equality, and exact comparison when both sides
   are plain numbers (integers, decimals, `a/b`, `\frac{a}{b}`). It settles most integer answers in
   microseconds.
2. Everything else goes to math-verify in a persistent worker subprocess
   (`drmas_envs.math._grade_worker`). A check may use `timeout_s` seconds of the worker's CPU time; a
   worker that overruns (say, on `9^{9^{9^{9}}}`) is killed, the check grades wrong, and a fresh worker
   is started at once. This bound holds from any thread and any process (math-verify's own signal-based
   timeout refuses non-main threads), and model text is never evaluated as code.

CPU time, not wall time: a grade must not depend on how busy the machine is. Under a wall-clock bound a
check that a loaded (or paused, or SIGSTOPped) machine drew out past the bound graded wrong, so two runs
of the same seed could part on one reward. A check that uses no CPU at all (a blocked worker) still ends
after `wall_timeout_s`. Where the worker's CPU time cannot be read (no /proc), the bound is wall time.

Inputs are capped before any parsing: answers longer than `max_answer_chars` or nested deeper than
`max_depth` braces grade wrong.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""The hard bound of one grading check, in seconds of the worker's CPU time."""
_POLL_S = 0.25
"""How often a waiting check reads the worker's CPU time, in seconds."""
_WORKER_SHARE = 0.5
"""The worker ends a check itself after this share of `timeout_s` (no restart); the kill is the backstop."""
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

_REMOVE = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]|\\quad|\\qquad|~|\s|\$|\\\$")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?$|^[+-]?\.\d+$")
_FRACTION = re.compile(r"^([+-]?)(?:\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}|\\frac(\d)(\d)|([+-]?\d+)/([+-]?\d+))$")


def normalise(text: str) -> str:
    r"""Typography-free form of an answer: no spaces, `$`, `\left`/`\right`, spacing commands; `\frac`."""
    s = _REMOVE.sub("", text)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    while s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
        s = s[1:-1]
    return s.rstrip(".")


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
    return depth == 0


def as_number(text: str) -> Fraction | None:
    """The exact value of a plain number in normalised form, or None if it is anything else."""
    if len(text) > 64:
        return None
    if _NUMBER.match(text):
        s = text.replace(",", "")
        return Fraction(s + "0" if s.endswith(".") else s)
    m = _FRACTION.match(text)
    if not m:
        return None
    sign, *parts = m.groups()
    num, den = next((a, b) for a, b in zip(parts[::2], parts[1::2]) if a is not None)
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return -value if sign == "-" else value


def fast_grade(answer: str, reference: str) -> bool | None:
    """True/False when the fast path can decide, None when math-verify must."""
    a, r = normalise(answer), normalise(reference)
    if a == r:
        return True
    na, nr = as_number(a), as_number(r)
    if na is not None and nr is not None:
        return na == nr
    return None


def brace_depth(text: str) -> int:
    """The deepest `{` nesting in `text`."""
    depth = deepest = 0
    for c in text:
        if c == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif c == "}":
            depth -= 1
    return deepest


class Grader:
    """Grades answers against references with a hard time bound per check; safe in threads and processes.

    Args:
        timeout_s: the most CPU seconds one check may use in the worker; an overrunning worker is
            killed (the check grades wrong).
        wall_timeout_s: the most wall seconds one check may take, CPU or not (a blocked worker);
            default max(60, 10 x timeout_s).
        max_answer_chars: longer answers grade wrong without parsing.
        max_depth: answers nested deeper than this many braces grade wrong without parsing.
        startup_timeout_s: how long to wait for a (re)started worker to import math-verify; not
            counted in `timeout_s`.

    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        wall_timeout_s: float | None = None,
        max_answer_chars: int = 1000,
        max_depth: int = 40,
        startup_timeout_s: float = 120.0,
    ):
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = float(timeout_s)
        self.wall_timeout_s = float(wall_timeout_s) if wall_timeout_s else max(60.0, 10 * self.timeout_s)
        self.max_answer_chars = max_answer_chars
        self.max_depth = max_depth
        self.startup_timeout_s = startup_timeout_s
        self.stats = {"fast": 0, "worker": 0, "over_budget": 0, "timeouts": 0, "capped": 0}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._buf = b""
        self._ready = False

    # -- public ---------------------------------------------------------------------------------
    def grade(self, answer: str | None, reference: str) -> bool:
        """Whether `answer` (an extracted box content, or None) is equivalent to `reference`."""
        if answer is None or not isinstance(answer, str):
            return False
        if len(answer) > self.max_answer_chars or brace_depth(answer) > self.max_depth:
            self.stats["capped"] += 1
            return False
        decided = fast_grade(answer, reference)
        if decided is not None:
            self.stats["fast"] += 1
            return decided
        self.stats["worker"] += 1
        return self.ask_worker(answer, reference)

    __call__ = grade

    @property
    def worker_pid(self) -> int | None:
        """The math-verify worker's process id (None until a check first needs it, or after `close`)."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Stop the worker (a later `grade` starts a new one)."""
        if self._proc is not None and self._pid == os.getpid():
            self._kill()

    # -- the worker -------------------------------------------------------------------------------
    def ask_worker(self, answer: str, reference: str) -> bool:
        """Whether `answer` is equivalent to `reference`, by the math-verify worker alone: no length or
        depth cap, no fast path, no `stats["worker"]` count (what `grade` calls when the fast path
        cannot decide). A check over its time bound grades wrong.
        """
        if self._pid != os.getpid():  # forked: the worker and lock belong to the parent process
            self._pid, self._proc, self._lock, self._buf, self._ready = os.getpid(), None, threading.Lock(), b"", False
        with self._lock:
            self._ensure_started()
            # the worker's own CPU timer usually ends a slow check without a restart; the kill is the backstop
            request = {"answer": answer, "reference": reference, "cpu_s": _WORKER_SHARE * self.timeout_s}
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
                reply = json.loads(self._await_reply())
            except TimeoutError:
                self.stats["timeouts"] += 1
                logger.info("grading went over its bound; worker restarted (answer %r)", answer[:80])
                self._restart()
                return False
            except (OSError, EOFError, ValueError) as exc:
                logger.warning("grading worker failed (%s); restarted", exc)
                self._restart()
                return False
            if str(reply.get("error", "")).startswith("OverBudget"):
                self.stats["over_budget"] += 1  # the worker ended the check itself, no restart
            return bool(reply.get("ok", False))

    def _spawn(self) -> None:
        # the worker must import this very drmas_envs, whatever the caller did to sys.path
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
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
        if not self._ready:
            try:
                line = self._readline(time.monotonic() + self.startup_timeout_s)
            except (TimeoutError, EOFError) as exc:
                self._kill()
                raise RuntimeError(
                    "the math-verify grading worker did not start; check that `python -m "
                    "drmas_envs.math._grade_worker` runs (is math-verify installed?)"
                ) from exc
            try:
                hello = json.loads(line)
            except ValueError:
                hello = {}
            if not isinstance(hello, dict) or not hello.get("ready"):
                self._kill()
                reason = hello.get("error") if isinstance(hello, dict) and hello.get("error") else line[:200]
                raise RuntimeError(f"the math-verify grading worker failed its self-check: {reason!r}")
            self._ready = True

    def _await_reply(self) -> bytes:
        """The worker's reply; TimeoutError once the check used `timeout_s` of its CPU or `wall_timeout_s`."""
        pid = self._proc.pid
        start = _cpu_seconds(pid)
        if start is None:  # the worker's CPU time cannot be read here: wall time instead
            return self._readline(time.monotonic() + self.timeout_s)
        wall_end = time.monotonic() + self.wall_timeout_s
        while True:
            try:
                return self._readline(min(wall_end, time.monotonic() + _POLL_S))
            except TimeoutError:
                used = _cpu_seconds(pid)
                if time.monotonic() >= wall_end or used is None or used - start >= self.timeout_s:
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


_SHARED: dict[float, Grader] = {}
_SHARED_LOCK = threading.Lock()


def default_grader(timeout_s: float = DEFAULT_TIMEOUT_S) -> Grader:
    """The process-wide shared `Grader` with this time bound (created on first use, stopped at exit).

    Envs share it, so the hundreds of envs of an evaluation use one worker process, not hundreds.
    """
    with _SHARED_LOCK:
        grader = _SHARED.get(float(timeout_s))
        if grader is None:
            grader = _SHARED[float(timeout_s)] = Grader(timeout_s)
            atexit.register(grader.close)
        return grader


def grade(answer: str | None, reference: str) -> bool:
    """Grade with the shared default `Grader`."""
    return default_grader().grade(answer, reference)
