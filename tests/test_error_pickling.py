"""Every error class the package defines survives pickling with its type, message and
fields, and crosses a process pool: engines run the scheduler, the tokenizer and the
tensor-parallel workers in separate processes and send errors between them.

The classes are enumerated, not listed: every module of the package (the scheduler, its
integrations, the kernels and the codemod) is imported, and every public exception class
defined in one is checked, so a new class whose instances cannot be rebuilt fails here.
"""

from __future__ import annotations

import concurrent.futures
import copy
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
import sys

import pytest

ROOTS = ("mm_schedule", "mm_schedule.kernels", "mm_schedule.codemods")


def _project_modules() -> list:
    names = []
    for root in ROOTS:
        package = importlib.import_module(root)
        names.append(root)
        for info in pkgutil.walk_packages(package.__path__, root + "."):
            if info.name.rsplit(".", 1)[-1] != "__main__":  # a __main__ runs its command when imported
                names.append(info.name)
    return [importlib.import_module(name) for name in dict.fromkeys(names)]


def error_classes() -> list[type]:
    found = set()
    for module in _project_modules():
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__
                    and not value.__name__.startswith("_")):
                found.add(value)
    from mm_schedule.errors import MMScheduleError

    stack = [MMScheduleError]
    while stack:  # subclasses of the base wherever they are defined
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("mm_schedule") and not cls.__name__.startswith("_"):
            found.add(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


CLASSES = error_classes()


def _value(name: str, annotation, k: int):
    """A value for a constructor parameter, from its annotation (distinct per parameter,
    so that a field restored into the wrong attribute is noticed)."""
    text = str(annotation)
    if "int" in text:
        return 0o010644 + k if name == "mode" else 40 + k
    if "tuple" in text:
        return (k, "bfloat16")
    return f"{name}-{k}"


def example(cls: type) -> tuple[tuple, dict]:
    """Arguments that construct ``cls`` with every parameter set."""
    own_init = any("__init__" in vars(c) for c in cls.__mro__ if c.__module__.startswith("mm_schedule"))
    if not own_init:
        return (f"{cls.__name__} raised for request 3, item hash 0xbeef",), {}
    args, kwargs = [], {}
    for k, (name, parameter) in enumerate(inspect.signature(cls).parameters.items()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        value = _value(name, parameter.annotation, k)
        if parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def _state(error: BaseException) -> tuple:
    oserror = (error.errno, error.strerror, error.filename) if isinstance(error, OSError) else None
    return type(error), str(error), error.args, dict(vars(error)), oserror


def round_trip_problems(cls: type) -> list[str]:
    """What is lost when an instance of ``cls`` is pickled and unpickled (empty: nothing)."""
    args, kwargs = example(cls)
    error = cls(*args, **kwargs)
    error.add_note("raised on rank 1")
    problems = []
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        try:
            back = pickle.loads(pickle.dumps(error, protocol=protocol))
        except Exception as exc:
            problems.append(f"protocol {protocol}: {type(exc).__name__}: {exc}")
            continue
        if _state(back) != _state(error):
            problems.append(f"protocol {protocol}: {_state(back)} != {_state(error)}")
    return problems


def test_the_enumeration_finds_the_errors_of_every_part():
    names = {c.__name__ for c in CLASSES}
    expected = {"MMScheduleError", "EmbeddingLengthMismatch", "RankFaultError", "RankTimeoutError", "CacheLayoutError",
                "EncoderCacheMiss", "UnsupportedVLLMRelease", "UnsupportedSGLangVersion", "ConfigError",
                "NotRegularFile", "NotebookError", "UsageError", "TunerError"}
    assert expected <= names, expected - names
    assert len(CLASSES) >= 29
    # Every one of them has fields to lose, or a message at least.
    assert sum(1 for c in CLASSES if example(c)[1]) >= 4


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_round_trip_keeps_type_message_and_fields(cls):
    assert round_trip_problems(cls) == []
    args, kwargs = example(cls)
    error = cls(*args, **kwargs)
    assert _state(copy.deepcopy(error)) == _state(error)


def _keyword_only(base: type) -> type:
    def __init__(self, *, expected: int) -> None:
        self.expected = expected
        base.__init__(self, f"expected {expected}")

    return type("KeywordOnly", (base,), {"__init__": __init__, "__module__": "mm_schedule.errors"})


def test_a_class_without_support_is_caught(monkeypatch):
    """Negative control: a new class whose keyword-only constructor default pickling cannot
    call is reported; the same class on the project's base round-trips."""
    import mm_schedule.errors as errors

    for base, supported in ((ValueError, False), (errors.MMScheduleError, True)):
        cls = _keyword_only(base)
        monkeypatch.setattr(errors, "KeywordOnly", cls, raising=False)  # found where pickle looks
        problems = round_trip_problems(cls)
        if supported:
            assert problems == []
        else:
            assert problems and "TypeError" in problems[0]


def _spawned_pool():
    return concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))


def test_errors_raised_in_worker_processes_arrive_whole_and_leave_the_pool_working():
    """Each class is raised inside a spawned worker (the worker builds it), and the caller
    gets that error back; the pool keeps serving (no ``BrokenProcessPool``)."""
    with _spawned_pool() as pool:
        futures = {}
        for cls in CLASSES:
            args, kwargs = example(cls)
            futures[cls] = pool.submit(exec, "raise cls(*args, **kwargs)", {"cls": cls, "args": args, "kwargs": kwargs})
        after = pool.submit(sum, [1, 2, 3])
        for cls, future in futures.items():
            args, kwargs = example(cls)
            got = future.exception(timeout=120)
            assert _state(got) == _state(cls(*args, **kwargs)), cls
        assert after.result(timeout=120) == 6
        assert pool.submit(pow, 2, 10).result(timeout=120) == 1024
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
