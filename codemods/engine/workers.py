"""Worker processes that transform one file at a time.

libcst's native parser can kill the process it runs in (a segfault on a few
thousand nested parentheses) and its tree code can exceed Python's recursion
limit. Every file is therefore transformed in a worker process, even with one job:
a worker that dies takes only the file it was holding with it; that file is
reported as failed and a fresh worker carries on with the rest. The parent waits
on the workers' pipes and their process sentinels together, so a dead worker is
noticed at once and never waited for.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from ..report.failures import Failure
from ..report.findings import Finding


@dataclass
class Task:
    key: int  # the caller's handle for the file
    shown: str
    package: str | None
    source: bytes
    notebook: bool = False


@dataclass
class Outcome:
    new_source: bytes | None = None
    findings: list[Finding] = field(default_factory=list)
    cells: list[int | None] = field(default_factory=list)  # per finding, for notebooks
    error: Failure | None = None


# The function a worker applies to each task: (task) -> Outcome. Set once per worker.
Transform = Callable[[Task], Outcome]


def _serve(conn, make_transform, close_fds) -> None:  # pragma: no cover - runs in a worker
    # The parent decides what Ctrl-C means and stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    faulthandler.disable()  # a crash is reported by the parent, as one line for its file
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    transform = make_transform()
    parent = os.getppid()
    while True:
        try:
            # Forked siblings hold copies of this pipe, so EOF may never come: stop on
            # a None message, or when the parent is gone (killed).
            while not conn.poll(1.0):
                if os.getppid() != parent:
                    return
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        conn.send(_guarded(transform, task))


def _guarded(transform: Transform, task: Task) -> Outcome:
    try:
        return transform(task)
    except RecursionError:
        return _crash("too deeply nested for the parser (recursion limit); file left as is")
    except MemoryError:
        return _crash("ran out of memory; file left as is")
    except Exception as exc:  # a bug of ours must not stop the run over other files
        return _crash(f"internal error ({type(exc).__name__}: {exc}); file left as is")


def _crash(message: str) -> Outcome:
    return Outcome(error=Failure.of("parser-crash", message))


class _Worker:
    def __init__(self, context, make_transform, close_fds) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, make_transform, tuple(close_fds)), daemon=True
        )
        self.process.start()
        child.close()
        self.task: Task | None = None
        self.started = 0.0

    def send(self, task: Task) -> None:
        self.task, self.started = task, time.monotonic()
        self.conn.send(task)

    def died(self) -> Outcome:
        """What to report for the task this worker held when it died."""
        self.process.join(1)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return _crash(f"crashed the parser (worker killed by {name}); file left as is")
        return _crash(f"crashed the parser (worker exited with status {code}); file left as is")

    def stop(self, force: bool = False) -> None:
        if force:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.conn.close()
        self.process.join(None if force else 5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class WorkerPool:
    """Runs tasks on up to ``jobs`` workers; ``results`` yields ``(task, Outcome)`` as
    they finish and takes more work through ``submit`` meanwhile."""

    def __init__(self, jobs: int, make_transform: Callable[[], Transform], *,
                 timeout: float | None = None, close_fds: tuple[int, ...] = ()) -> None:
        method = "fork" if sys.platform == "linux" else "spawn"
        self._context = multiprocessing.get_context(method)
        self._jobs = max(1, jobs)
        self._make = make_transform
        self._timeout = timeout
        self._close_fds = close_fds
        self._queue: deque[Task] = deque()
        self._idle: list[_Worker] = []
        self._busy: list[_Worker] = []
        self._all: list[_Worker] = []

    def submit(self, task: Task) -> None:
        self._queue.append(task)

    def _spawn(self) -> _Worker:
        worker = _Worker(self._context, self._make, self._close_fds)
        self._all.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        self._busy.remove(worker)
        self._all.remove(worker)
        worker.stop(force=True)

    def results(self) -> Iterator[tuple[Task, Outcome]]:
        lost = 0  # workers in a row found dead before a task reached them
        while self._queue or self._busy:
            while self._queue and (self._idle or len(self._all) < self._jobs):
                worker = self._idle.pop() if self._idle else self._spawn()
                task = self._queue.popleft()
                self._busy.append(worker)
                try:
                    worker.send(task)
                except OSError:
                    # The worker died while idle (killed from outside): the task never
                    # reached it, so it goes to another one, unless workers cannot start.
                    dead = worker.died()
                    self._retire(worker)
                    lost += 1
                    if lost > self._jobs + 2:
                        yield task, dead
                    else:
                        self._queue.appendleft(task)
                    continue
                lost = 0
            waiting = {w.conn: w for w in self._busy} | {w.process.sentinel: w for w in self._busy}
            ready = wait(list(waiting), timeout=self._next_deadline())
            finished: dict[int, _Worker] = {id(waiting[r]): waiting[r] for r in ready}
            for worker in finished.values():
                task = worker.task
                outcome = None
                if worker.conn.poll():
                    try:
                        outcome = worker.conn.recv()
                    except (EOFError, OSError):
                        outcome = None
                if outcome is None:
                    dead = worker.died()
                    self._retire(worker)
                    yield task, dead
                    continue
                worker.task = None
                self._busy.remove(worker)
                self._idle.append(worker)
                yield task, outcome
            yield from self._expire()

    def _next_deadline(self) -> float | None:
        if self._timeout is None or not self._busy:
            return None
        oldest = min(w.started for w in self._busy)
        return max(0.0, oldest + self._timeout - time.monotonic())

    def _expire(self) -> Iterator[tuple[Task, Outcome]]:
        if self._timeout is None:
            return
        now = time.monotonic()
        for worker in [w for w in self._busy if now - w.started >= self._timeout]:
            task = worker.task
            self._retire(worker)
            yield task, Outcome(error=Failure.of(
                "timeout", f"took longer than {self._timeout:g} s; file left as is"))

    def close(self, force: bool = False) -> None:
        for worker in self._all:
            worker.stop(force=force)
        self._all.clear()
        self._idle.clear()
        self._busy.clear()
