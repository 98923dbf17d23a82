"""The ``consumer_exit`` patch: ``BufferedIterator`` reads batches ahead in a daemon thread that
nothing stops. When ``fairseq-train`` stops mid-epoch (``--max-update``), that thread is still
collating the next batches as the interpreter exits; caught inside a torch call, it ends in
``terminate called without an active exception`` and the process aborts (status -6) after the
checkpoints were saved. Patched: at exit each consumer finishes its batch and stops.
"""

import atexit
import contextlib
import queue
import threading
import time
import weakref

from fairseq.data import iterators


class _UntilStopped:
    """``source``'s items until ``stop`` is set; checked before each item is read, so a
    consumer asked to stop finishes the batch it is collating and reads no other."""

    def __init__(self, source, stop: threading.Event):
        self.source, self.stop = source, stop

    def __len__(self):
        return len(self.source)

    def __iter__(self):
        items = iter(self.source)
        while not self.stop.is_set():
            try:
                item = next(items)
            except StopIteration:
                return
            yield item


#: the live consumers that :func:`stop_consumers` stops when the process exits
_CONSUMERS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


class StoppableBackgroundConsumer(iterators.BackgroundConsumer):
    """fairseq's batch-reading daemon thread, with a ``stop`` event that ends its loop."""

    def __init__(self, queue_, source, max_len, cuda_device):
        self.stop = threading.Event()
        super().__init__(queue_, _UntilStopped(source, self.stop), max_len, cuda_device)
        _CONSUMERS.add(self)


def stop_consumers(timeout: float = 30.0) -> None:
    """Stop every live consumer and wait for it (at most ``timeout`` seconds in all): each
    finishes its batch, its queue is emptied so that no ``put`` blocks, and it ends."""
    consumers = [c for c in list(_CONSUMERS) if c.is_alive()]
    for consumer in consumers:
        consumer.stop.set()
    deadline = time.monotonic() + timeout
    for consumer in consumers:
        while consumer.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                while True:
                    consumer._queue.get_nowait()
            consumer.join(0.01)


def consumer_outlives_its_iterator() -> bool:
    """Is ``BufferedIterator``'s reading thread a daemon left running, with nothing to stop it,
    when its iterator is abandoned mid-epoch (as ``fairseq-train`` leaves it at
    ``--max-update``)? Such a thread is still inside torch when the interpreter exits."""
    iterator = iterators.BufferedIterator(1, list(range(3)))
    next(iterator)  # the consumer has read on and waits to put the next item
    consumer = iterator._consumer
    outlives = consumer.daemon and consumer.is_alive() and not isinstance(consumer, StoppableBackgroundConsumer)
    while consumer.is_alive():  # let the probe's own thread finish
        with contextlib.suppress(queue.Empty):
            iterator._queue.get(timeout=0.01)
    return outlives


def install(patch) -> None:
    patch.replace(iterators, "BackgroundConsumer", StoppableBackgroundConsumer)
    atexit.register(stop_consumers)
    patch.on_removal(lambda: atexit.unregister(stop_consumers))
