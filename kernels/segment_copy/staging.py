"""Where per-call segment tables wait between the host and the kernel: a ring of reused
pinned host buffers and device tables, one ring per device.

A staged table is read twice after the call that staged it has returned: by the
host-to-device copy (from the pinned buffer) and by the kernel (from the device table),
both queued on the stream. A slot's buffers may be written again only once both have
run, which the slot's event says: it is recorded right after the launch, on the launch's
stream, so it completes after the copy and the kernel before it.

Claiming a slot never waits for the device while slots are in flight: the ring asks the
oldest slot's event whether it has completed (a query, no wait) and, when it has not,
adds a slot instead, up to ``MAX_SLOTS``. Only a host that has queued that many staged
launches ahead of the device (it would be ``MAX_SLOTS`` launches behind) waits, for the
oldest one, rather than grow without bound. Claims are serialised by a lock, so threads
launching on one device never share a slot; a claimed slot belongs to its caller until
``launched()``.
"""

from __future__ import annotations

import threading


class StagingRing:
    """``SLOTS`` slots to start with, more while the device is behind (``MAX_SLOTS``).

    ``host_empty(n)`` / ``device_empty(n)`` allocate a pinned host buffer and a device
    table of ``n`` int64 words; ``new_event()`` an event with ``record()`` (on the current
    stream), ``query()`` and ``synchronize()``."""

    SLOTS = 8
    MAX_SLOTS = 256

    def __init__(self, host_empty, device_empty, new_event):
        self._host_empty, self._device_empty, self._new_event = host_empty, device_empty, new_event
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        # Oldest launch first at ``_next``: slots are reused in the order they were launched.
        self._slots = [_Slot(self) for _ in range(self.SLOTS)]
        self._next = 0

    def __len__(self) -> int:
        return len(self._slots)

    def claim(self, n_words: int) -> _Slot:
        """A slot whose buffers hold at least ``n_words`` words and that no queued copy or
        launch still reads; the caller writes ``slot.host``, copies it to ``slot.device``
        and calls ``slot.launched()`` right after the launch that reads it."""
        with self._lock:
            slot = self._slots[self._next]
            if slot.busy():
                if len(self._slots) < self.MAX_SLOTS:
                    # The oldest slot is still in flight (on one stream, so is every later one):
                    # one more, placed before it, so that the oldest stays next.
                    slot = _Slot(self)
                    self._slots.insert(self._next, slot)
                else:
                    slot.wait()  # MAX_SLOTS launches behind: back-pressure on the host
            self._next = (self._next + 1) % len(self._slots)
            slot.claimed = True
        if slot.words < n_words:
            slot.grow(1 << (n_words - 1).bit_length())
        return slot


class _Slot:
    __slots__ = ("claimed", "device", "event", "host", "host_address", "ring", "words")

    def __init__(self, ring: StagingRing):
        self.ring, self.words, self.event, self.claimed = ring, 0, None, False
        self.host = self.device = None
        self.host_address = 0

    def busy(self) -> bool:
        """Claimed and not launched yet, or launched and not finished on the device."""
        return self.claimed or (self.event is not None and not self.event.query())

    def wait(self) -> None:
        """Called with the ring's lock held."""
        while self.claimed:  # another thread is queueing its launch
            self.ring._released.wait()
        if self.event is not None:
            self.event.synchronize()

    def grow(self, words: int) -> None:
        self.host = self.ring._host_empty(words)
        self.device = self.ring._device_empty(words)
        self.host_address, self.words = self.host.data_ptr(), words

    def launched(self) -> None:
        """Mark the slot in use by the launch just queued on the current stream, and
        hand it back to the ring."""
        if self.event is None:
            self.event = self.ring._new_event()
        self.event.record()
        with self.ring._released:
            self.claimed = False
            self.ring._released.notify_all()
