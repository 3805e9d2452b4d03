"""Every error mm_schedule raises on bad input, in one place.

Each class subclasses the builtin a caller would already catch (``ValueError`` for
input that is wrong, ``RuntimeError`` for a state that should not happen) so existing
``except`` clauses in serving code keep working. Messages name the request index, the
item hash and the expected and received counts, because a serving engine logs them
for one request among thousands.

Every error survives ``pickle`` (engines run the scheduler, the tokenizer and the
tensor-parallel workers in separate processes and send errors between them): the base
class pickles the builtin's arguments (the message) and the instance's fields, and
unpickling restores both without calling the subclass's keyword-only constructor.
"""

from __future__ import annotations


def _unpickled(cls: type, args: tuple, fields: dict) -> BaseException:
    # Built by the builtin base that lays the instance out (OSError for a TimeoutError
    # subclass, which reads its errno and file names from ``args``), as the subclass's
    # constructor ends up doing; the subclass's own constructor is not called again.
    base = max((c for c in cls.__mro__ if c.__module__ == "builtins"), key=lambda c: c.__basicsize__)
    error = base.__new__(cls, *args)
    base.__init__(error, *args)
    error.__dict__.update(fields)
    return error


class MMScheduleError(Exception):
    """Base class of every error raised by mm_schedule."""

    def __reduce__(self):
        # The builtin's own reduction gives its constructor arguments (OSError adds its
        # file names to ``args``); the fields are the instance's ``__dict__``.
        arguments = super().__reduce__()[1]
        return _unpickled, (type(self), arguments, dict(self.__dict__))


class EmbeddingLengthMismatch(MMScheduleError, ValueError):
    """The encoder (or a precomputed embedding) returned a different number of rows
    than the item has placeholder tokens. Never cropped, split or cached."""

    def __init__(
        self,
        *,
        expected: int,
        received: int,
        request: int | None = None,
        item_hash: int | None = None,
        what: str = "embedding rows",
        hint: str = "",
    ) -> None:
        self.expected = expected
        self.received = received
        self.request = request
        self.item_hash = item_hash
        where = []
        if request is not None:
            where.append(f"request {request}")
        if item_hash is not None:
            where.append(f"item hash {item_hash}")
        prefix = f"{', '.join(where)}: " if where else ""
        msg = f"{prefix}{what}: expected {expected}, got {received}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class EncoderOutputError(MMScheduleError, ValueError):
    """The encoder's return value has the wrong type, rank, item count or hidden size."""


class InvalidItemError(MMScheduleError, ValueError):
    """An item (or the batch layout that refers to it) is malformed: missing hash,
    unsorted or overlapping spans, offsets outside the prompt, inconsistent sizes."""


class SegmentError(MMScheduleError, ValueError):
    """A segment table does not fit its sources or destination; raised on the host,
    before anything is launched."""


class KernelInputError(MMScheduleError, ValueError):
    """Tensors given to a kernel have the wrong device, dtype, rank or layout."""


class PrecomputedEmbeddingError(MMScheduleError, NotImplementedError):
    """Only some items of a batch carry precomputed embeddings (SGLang raises
    ``NotImplementedError`` here too, so callers that catch it keep working)."""


class CacheConfigError(MMScheduleError, ValueError, TypeError):
    """An ``EmbeddingCache`` was configured with a value it cannot use: a budget that is
    not a non-negative integer number of bytes, a declared hidden size or dtype of the
    wrong type. Catchable as ``ValueError`` or ``TypeError``."""


class CacheLayoutError(EncoderOutputError):
    """An encoder output disagrees with the hidden size or dtype the cache holds (or was
    declared to hold) for its modality. Raised before anything of the step is cached;
    nothing is evicted. ``key``, ``modality``, ``got`` and ``expected`` say which."""

    def __init__(self, message: str, *, key: int | None = None, modality: str | None = None,
                 got: tuple | None = None, expected: tuple | None = None) -> None:
        self.key = key
        self.modality = modality
        self.got = got
        self.expected = expected
        super().__init__(message)


class ConflictingHashError(InvalidItemError):
    """One item hash names items of two modalities in one step (an image and a video of
    the same length, say): which encoder and which cached modality it stands for would
    depend on the rest of the batch, so the step is refused. ``item_hash`` and
    ``modalities`` (the first seen, then the other) say which."""

    def __init__(self, message: str, *, item_hash: object = None, modalities: tuple = ()) -> None:
        self.item_hash = item_hash
        self.modalities = modalities
        super().__init__(message)


class CacheStateError(MMScheduleError, RuntimeError):
    """The embedding cache was given something it cannot hold (a value that is not a
    tensor), or used in a state that should not happen."""


class MoveMapError(MMScheduleError, ValueError):
    """A codemod move map, or a module source it is derived from, is malformed or
    missing; the message names the file and what was wrong."""


class KernelConfigError(MMScheduleError, ValueError):
    """A per-GPU kernel config file (or the folder named by
    ``MM_SCHEDULE_KERNEL_CONFIG_DIR``) is missing or malformed; the message names the
    file and the entry that is wrong."""


class SourceOverlapError(KernelInputError):
    """A source tensor shares memory with the destination it would be copied into: the
    copy would read rows that other programs of the same launch are overwriting."""


class GraphCaptureError(MMScheduleError, RuntimeError):
    """A call that stages host data per call (and so cannot be replayed from a CUDA graph)
    was made while the current stream is capturing; plan outside the capture and capture
    only ``run_segments``."""


class CachedEmbeddingError(MMScheduleError, ValueError):
    """A cached embedding does not fit the step that hit it (hidden size, dtype or
    device), or assembling it failed. The entry has been evicted, so the next step
    encodes the item again; the message names the request and the item hash."""


class RankMismatchError(MMScheduleError, RuntimeError):
    """The ranks of a process group planned different steps (different items, rows
    or settings), so no agreement is possible. Raised on every rank alike."""


class RankFaultError(MMScheduleError, RuntimeError):
    """A rank's encoder raised, or its output failed validation, during a step shared
    by a process group. Every rank raises this same error (same message) for that
    step; nothing of the step is cached, and the next step starts clean."""

    def __init__(self, message: str, *, rank: int, request: int | None, item_hash: int | None) -> None:
        self.rank = rank
        self.request = request
        self.item_hash = item_hash
        super().__init__(message)


class RankCommunicationError(MMScheduleError, RuntimeError):
    """A collective of the step's process group failed (a peer closed its connection,
    the backend reported an error). The group cannot be trusted afterwards."""


class RankTimeoutError(RankCommunicationError, TimeoutError):
    """A rank did not reach a collective of the step within the process group's
    timeout (it crashed, hung, or is serving another batch)."""


class UnsupportedModelError(MMScheduleError, TypeError):
    """A model given to an integration adapter has no vision path the adapter knows;
    the message names the model type and the ones supported."""
