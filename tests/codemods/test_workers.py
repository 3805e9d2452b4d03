"""The worker pool on its own: a worker that dies takes only its file with it."""

from __future__ import annotations

import os
import signal

from mm_schedule.codemods.engine.workers import Outcome, Task, WorkerPool


def _echo_or_die():
    def transform(task: Task) -> Outcome:
        if task.shown == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if task.shown == "exit":
            os._exit(3)
        if task.shown == "recurse":
            def down(n):
                return down(n + 1)
            down(0)
        return Outcome(new_source=task.source.upper())

    return transform


def _tasks(*names):
    return [Task(i, name, None, name.encode()) for i, name in enumerate(names)]


def _run(pool, tasks):
    for task in tasks:
        pool.submit(task)
    try:
        return {task.shown: outcome for task, outcome in pool.results()}
    finally:
        pool.close()


def test_each_death_is_charged_to_the_file_that_caused_it():
    names = ("a", "segfault", "b", "exit", "c", "recurse", "d")
    for jobs in (1, 3):
        got = _run(WorkerPool(jobs, _echo_or_die), _tasks(*names))
        assert set(got) == set(names)
        for name in "abcd":
            assert got[name].new_source == name.upper().encode() and got[name].error is None
        crashed = {n: got[n].error for n in ("segfault", "exit", "recurse")}
        assert {e.code for e in crashed.values()} == {"MMS907"}
        assert crashed["segfault"].message.startswith("crashed the parser (worker killed by SIGSEGV)")
        assert crashed["exit"].message.startswith("crashed the parser (worker exited with status 3)")
        assert crashed["recurse"].message.startswith("too deeply nested for the parser")


def test_a_worker_killed_while_idle_costs_no_file():
    pool = WorkerPool(1, _echo_or_die)
    first, second = _tasks("a", "b")
    pool.submit(first)
    assert [t.shown for t, _ in pool.results()] == ["a"]
    (idle,) = pool._idle
    os.kill(idle.process.pid, signal.SIGKILL)
    idle.process.join()
    got = _run(pool, [second])
    assert got["b"].error is None and got["b"].new_source == b"B"
