"""One sampled token per live row, with the random numbers ``torch.multinomial`` would have used
for the whole original batch.

transformers' ``generate`` samples every step with ``torch.multinomial(probs, 1)`` over all B rows
of the batch, finished ones included. On CPU that is ``argmax(probs / q)`` with
``q = empty_like(probs).exponential_()``: B x V exponentials, made one after the other in
row-major order, each from one 64-bit draw x of the generator as ``-log1p(-u)`` in double, u = the
low 53 bits of x times 2^-53, then rounded to float. So the draws of original row r at a step are
numbers r*V .. (r+1)*V - 1 of that step's stretch of the stream, whatever the other rows hold.

``RowStream.sample`` makes the exponentials of the live rows only, in their own places of the
stream, and moves the stream past every other row with ``random_`` on int64 (the same one 64-bit
draw per number, no log: about a fifth of an exponential's cost). It also makes the live rows'
exponentials from such int64 draws with vectorised tensor ops, twice as fast as ``exponential_``'s
one-number-at-a-time loop. The tokens are the ones ``multinomial`` over the whole batch gives, bit
for bit, and the generator ends where it would have. On the real model's short answers (vocabulary
49,152, 32 rows, most of them done) ``exponential_`` was a fifth of the decode's time.

That layout is torch's CPU kernel, not a documented contract: ``supported`` checks it once per
process (values and generator state against ``exponential_`` on a private generator) and is False
where it does not hold, and on CUDA, whose counter-based generator is laid out otherwise; the
decode then draws over the whole batch as before.
"""

from __future__ import annotations

import functools

import torch

# int64 numbers moved over per random_ call: the scratch buffer (8 MiB) is allocated once per
# decode call, not per step, and stays small whatever the batch.
SKIP_CHUNK = 1 << 20
# the low 53 bits of a 64-bit draw make a double in [0, 1), as torch's uniform_real does
_MANTISSA = (1 << 53) - 1
_LAYOUT_CHECK_NUMBERS = 4099  # a length of no round size; a few microseconds once per process


def supported(device: torch.device) -> bool:
    """Whether the draws can be made as described above: the CPU generator, and a torch whose
    ``exponential_`` has that layout."""
    return device.type == "cpu" and _layout_holds()


@functools.cache
def _layout_holds() -> bool:
    expected, ours = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    values = torch.empty(_LAYOUT_CHECK_NUMBERS).exponential_(generator=expected)
    return (torch.equal(_exponentials(_LAYOUT_CHECK_NUMBERS, ours), values)
            and torch.equal(ours.get_state(), expected.get_state()))


def _exponentials(numbers: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """What ``torch.empty(numbers).exponential_(generator=generator)`` makes, from the same draws."""
    u = torch.empty(numbers, dtype=torch.int64).random_(generator=generator).bitwise_and_(_MANTISSA).double()
    return u.mul_(-(2.0**-53)).log1p_().neg_().float()


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive row numbers in a sorted list, as [start, stop) pairs."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


class RowStream:
    """The random stream of ``multinomial`` over ``batch_rows`` rows of ``vocab`` entries each,
    drawn for a subset of the rows (the global CPU generator, as ``generate`` uses)."""

    def __init__(self, batch_rows: int, vocab: int):
        self.batch_rows, self.vocab = batch_rows, vocab
        self._scratch = torch.empty(min(batch_rows * vocab, SKIP_CHUNK), dtype=torch.int64)

    def _skip(self, numbers: int) -> None:
        while numbers > 0:
            take = min(numbers, self._scratch.numel())
            self._scratch[:take].random_()  # one 64-bit draw each, as an exponential takes
            numbers -= take

    def sample(self, probs: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """``probs``: (len(rows), V), the distributions of original rows ``rows`` (ascending).
        Returns (len(rows),) token ids: what ``multinomial`` over the whole batch gives these
        rows, whatever the other rows' distributions."""
        if probs.shape != (len(rows), self.vocab):
            raise ValueError(f"probs of shape {tuple(probs.shape)} for {len(rows)} rows of {self.vocab}")
        q = []
        at = 0
        for start, stop in _runs(rows):
            self._skip((start - at) * self.vocab)
            q.append(_exponentials((stop - start) * self.vocab).view(stop - start, self.vocab))
            at = stop
        self._skip((self.batch_rows - at) * self.vocab)
        return (probs / torch.cat(q)).argmax(dim=-1)
