"""Sample shuffling within a worker, and measures of shuffle quality.

Shards are read sequentially, so the samples of one shard arrive together.
:class:`ShuffleBuffer` mixes them: it holds up to ``size`` samples (and, if
asked, at most ``max_bytes`` of them); once full, each arriving sample takes
the place of a resident picked uniformly at random, which is emitted. At the
end of the stream the residents leave in random order. Its randomness comes
only from the numpy generator it is given, which the reader seeds from
``(seed, epoch, rank, worker)``.

The buffer does not wait until it is full to emit its first sample: it
starts once it holds ``initial`` samples (:data:`INITIAL_FILL`, 100 by
default, or ``size`` if smaller) and then grows by one sample per sample
emitted (it admits two for each one it lets out) until it holds ``size``.
A worker with a 10,000-sample buffer thus yields after reading 100 samples
instead of 10,000; the price is a narrower mix over the first
``2 * (size - initial)`` samples of the input.

:func:`round_robin` mixes several read parts of one worker before its
buffer (the reader's ``interleave``).

Two measures say how well a sequence is mixed (:func:`mean_displacement`,
:func:`shuffle_quality`); the reader benchmark reports them for shardkit and
for webdataset's buffer at the same size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

from shardkit.errors import UsageError
from shardkit.io.base import close_iterator

T = TypeVar("T")

#: Names the shuffle below (the buffer's admission and eviction rule and its
#: use of the generator). A reader state records it, because replaying a
#: state rebuilds the buffer by running this algorithm again: change the
#: value whenever a change here would send a seeded buffer's items out in
#: another order.
SHUFFLE_ALGORITHM = "growing_swap_buffer_v1"

#: Samples a buffer holds before it emits its first one (webdataset's
#: ``initial`` default too); it then grows to its size (see the module
#: docstring).
INITIAL_FILL = 100

#: Uniform variates drawn from the generator at a time (one numpy call per
#: batch instead of one per sample).
_DRAW_BATCH = 4096


class ShuffleBuffer(Generic[T]):
    """Growing swap-buffer shuffle of an item stream.

    The buffer emits its first item once it holds ``initial`` items; from
    then on the number it must hold before emitting (its target) rises by one
    with each item emitted, until it reaches ``size``. A byte cap counts the
    buffer as full whatever its target.

    Args:
        size: Most items held; 0 or 1 disables shuffling.
        rng: The random generator (seed it from seed + epoch + slot).
        max_bytes: Optional cap on the bytes held, measured by ``nbytes``; the
            buffer counts as full when either cap is reached.
        nbytes: Size of one item in bytes; needed when ``max_bytes`` is set.
        initial: Items held before the first is emitted (at most ``size``;
            default :data:`INITIAL_FILL`). ``initial >= size`` fills the whole
            buffer first.

    Raises:
        UsageError: Negative size, ``initial`` below 1, or ``max_bytes``
            without ``nbytes``.
    """

    def __init__(
        self,
        *,
        size: int,
        rng: np.random.Generator,
        max_bytes: int | None = None,
        nbytes: Callable[[T], int] | None = None,
        initial: int = INITIAL_FILL,
    ):
        if size < 0:
            raise UsageError(f"shuffle buffer size must be >= 0, not {size}")
        if initial < 1:
            raise UsageError(f"shuffle buffer initial fill must be >= 1, not {initial}")
        if max_bytes is not None and (max_bytes <= 0 or nbytes is None):
            raise UsageError("max_bytes needs a positive value and an nbytes function")
        self.size = size
        self.max_bytes = max_bytes
        self.rng = rng
        self.initial = initial
        self._nbytes = nbytes
        self._draws: list[float] = []
        #: Items the buffer must hold before it emits one (grows to ``size``).
        self._target = min(initial, size)

    def _uniform(self) -> float:
        if not self._draws:
            self._draws = self.rng.random(_DRAW_BATCH).tolist()
            self._draws.reverse()
        return self._draws.pop()

    def follow(self, *, nbytes: Callable[[T], int] | None = None) -> ShuffleBuffer[T]:
        """A buffer with the same caps that continues this one's random
        stream and growth (it shares the generator and the draws not yet
        used, and starts at this one's target fill).

        Args:
            nbytes: Size function for the new buffer's items (which may be of
                another type, e.g. samples where this buffer held positions).
        """
        other: ShuffleBuffer[T] = ShuffleBuffer(
            size=self.size, rng=self.rng, max_bytes=self.max_bytes, nbytes=nbytes, initial=self.initial
        )
        other._draws = self._draws
        other._target = self._target
        return other

    def shuffle(self, items: Iterable[T], *, resident: list[T] | None = None, held: int = 0) -> Iterator[T]:
        """Yield ``items`` in shuffled order.

        Args:
            items: The input stream.
            resident: Items already in the buffer, in buffer order (to go on
                from a state :meth:`advance` reached); the list is used in
                place. Default empty.
            held: Bytes those residents hold (with ``max_bytes``).
        """
        if self.size <= 1:
            yield from items
            return
        buf: list[T] = [] if resident is None else resident
        yield from self._mix(items, buf, held)
        while buf:
            yield self._pop_random(buf)

    def _mix(self, items: Iterable[T], buf: list[T], held: int) -> Iterator[T]:
        """The main part of :meth:`shuffle`: admit each item into ``buf``
        (holding ``held`` bytes), and once it holds the target count (or the
        byte cap), let out a random resident and raise the target by one, up
        to ``size``. Stops when ``items`` ends, leaving the residents in
        ``buf``."""
        size = self.size
        max_bytes = self.max_bytes
        nbytes = self._nbytes
        pop_random = self._pop_random
        target = self._target
        for item in items:
            buf.append(item)
            if max_bytes is not None:
                held += nbytes(item)  # type: ignore[misc]
                if held < max_bytes and len(buf) < target:
                    continue
            elif len(buf) < target:
                continue
            out = pop_random(buf)
            if max_bytes is not None:
                held -= nbytes(out)  # type: ignore[misc]
            if target < size:
                target += 1
                self._target = target  # before the yield: a stopped run leaves it right
            yield out

    def _pop_random(self, buf: list[T]) -> T:
        """Remove and return a uniformly chosen resident (swap with the last, pop)."""
        j = int(self._uniform() * len(buf))
        out = buf[j]
        buf[j] = buf[-1]
        buf.pop()
        return out

    def advance(self, items: Iterator[T], num_out: int) -> tuple[list[T], int, int]:
        """Run :meth:`shuffle` until ``num_out`` items have come out, keeping none.

        Takes from ``items`` and from the generator exactly what
        :meth:`shuffle` would by then, so that ``shuffle(rest of items,
        resident=..., held=...)`` with the returned buffer continues the same
        sequence. Used to rebuild a reader's buffer from positions alone.

        Args:
            items: The input stream (left positioned after the last item taken).
            num_out: Items to let out.

        Returns:
            The resident items in buffer order, the bytes they hold (0
            without ``max_bytes``), and how many items were taken from ``items``.
        """
        buf: list[T] = []
        held = taken = 0
        if self.size <= 1 or num_out <= 0:
            for _ in zip(range(max(num_out, 0)), items):
                taken += 1
            return buf, held, taken
        left = num_out
        for _ in self._mix(items, buf, 0):
            left -= 1
            if left == 0:
                break
        taken = len(buf) + num_out - left  # every item taken is still resident or has come out
        while buf and left > 0:  # the input ended: residents leave in random order
            self._pop_random(buf)
            left -= 1
        if self.max_bytes is not None:
            held = sum(map(self._nbytes, buf))  # type: ignore[arg-type]
        return buf, held, taken

    def _take_draws(self, count: int) -> np.ndarray:
        """The next ``count`` uniforms :meth:`_uniform` would return, taken at once."""
        parts: list[np.ndarray] = []
        have = self._draws  # reversed: the next draw is last
        if have and count:
            take = min(count, len(have))
            parts.append(np.array(have[len(have) - take :][::-1], dtype=np.float64))
            del have[len(have) - take :]
            count -= take
        while count > 0:
            batch = self.rng.random(_DRAW_BATCH)
            if count >= _DRAW_BATCH:
                parts.append(batch)
                count -= _DRAW_BATCH
            else:
                parts.append(batch[:count])
                rest = batch[count:].tolist()
                rest.reverse()
                self._draws = rest
                count = 0
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)

    def advance_indices(self, *, length: int | None, num_out: int) -> tuple[list[int], int]:
        """:meth:`advance` over the items ``0, 1, 2, ...`` (``length`` of
        them, None for endless), for a fresh buffer, vectorized: the growth
        to ``size`` runs step by step (at most ``2 * size`` items), the
        steady part as O(``num_out``) numpy work instead of a Python step per
        item. Only without ``max_bytes``.

        Returns:
            The resident item numbers in buffer order, and how many items
            were taken.
        """
        assert self.max_bytes is None and self.size > 1
        size = self.size
        if num_out <= 0:
            return [], 0
        # Growth, run as the plain algorithm: it ends once the target is
        # ``size`` and ``size - 1`` items are resident (the first item after
        # that is the first one emitted on arrival).
        grown = 2 * size - self._target - 1
        stop = grown if length is None else min(grown, length)
        buf: list[int] = []
        emitted = 0
        for _ in self._mix(iter(range(stop)), buf, 0):
            emitted += 1
            if emitted == num_out:
                return buf, len(buf) + emitted
        if stop < grown:  # the input ended while growing: residents leave in random order
            while buf and emitted < num_out:
                self._pop_random(buf)
                emitted += 1
            return buf, stop
        # Steady: the buffer's size - 1 slots stay in place; each arriving
        # item either leaves at once (draw hits the last slot) or takes the
        # place of the resident it sends out.
        left = num_out - emitted
        steady = left if length is None else min(left, max(length - grown, 0))
        slots = np.array(buf, dtype=np.int64)
        if steady:
            picks = (self._take_draws(steady) * size).astype(np.int64)
            stay = np.flatnonzero(picks < size - 1)
            last = np.full(size - 1, -1, dtype=np.int64)
            np.maximum.at(last, picks[stay], stay)
            written = last >= 0
            slots[written] = grown + last[written]
        buf = slots.tolist()
        taken = grown + steady
        left -= steady
        while buf and left > 0:  # the input ended: the rest leave in random order
            self._pop_random(buf)
            left -= 1
        return buf, taken


def round_robin(sources: list[Iterator[T]], *, first: int = 0) -> Iterator[T]:
    """One item from each source in turn until all are done.

    Args:
        sources: The sources; each is closed (if it can be) when this ends.
        first: The source the first round starts with (to continue an
            interrupted interleave).
    """
    active = list(sources)
    turn = list(sources[first:])
    try:
        while active:
            for source in turn:
                try:
                    yield next(source)
                except StopIteration:
                    active.remove(source)
            turn = list(active)
    finally:
        for source in sources:
            close_iterator(source)  # stop read-ahead threads


def mean_displacement(positions: Sequence[int] | np.ndarray) -> float:
    """Mean ``|output index - input index|`` over a shuffled sequence.

    Args:
        positions: For each output item, its index in the unshuffled input.

    Returns:
        The mean displacement in items (0 for no shuffle; about ``n / 3`` for
        a uniform permutation of ``n`` items).
    """
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size == 0:
        return 0.0
    return float(np.abs(pos - np.arange(pos.size)).mean())


def _batch_divergence(codes: np.ndarray, num_labels: int, batch_size: int) -> float:
    num_batches = codes.size // batch_size
    batches = codes[: num_batches * batch_size].reshape(num_batches, batch_size)
    flat = batches + (np.arange(num_batches)[:, None] * num_labels)
    hist = np.bincount(flat.ravel(), minlength=num_batches * num_labels).reshape(num_batches, num_labels)
    overall = np.bincount(codes, minlength=num_labels) / codes.size
    return float(0.5 * np.abs(hist / batch_size - overall).sum(axis=1).mean())


def shuffle_quality(labels: Sequence[object] | np.ndarray, *, batch_size: int, seed: int = 0) -> float:
    """How far batches' label mix is from that of i.i.d. batches.

    Cuts the sequence into batches of ``batch_size`` and takes the mean total
    variation distance between each batch's label histogram and the label
    histogram of the whole sequence, divided by the same figure for a uniform
    random permutation of the same labels (drawn with ``seed``).

    Args:
        labels: The label (class) of each item, in sequence order.
        batch_size: Items per batch.
        seed: Seed of the reference permutation.

    Returns:
        About 1.0 for a sequence as mixed as an i.i.d. one; larger is worse (a
        class-sorted sequence gives a large value).

    Raises:
        UsageError: Fewer than one batch of labels.
    """
    _, codes = np.unique(np.asarray(labels), return_inverse=True)
    codes = codes.ravel().astype(np.int64)
    if batch_size < 1 or codes.size < batch_size:
        raise UsageError(f"need at least one batch of {batch_size} labels, got {codes.size}")
    num_labels = int(codes.max()) + 1
    reference = np.random.default_rng(seed).permutation(codes)
    baseline = _batch_divergence(reference, num_labels, batch_size)
    value = _batch_divergence(codes, num_labels, batch_size)
    return value / baseline if baseline > 0 else 1.0
