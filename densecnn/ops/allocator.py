"""What torch's own buffers cost the solvers that run torch's ops, beyond what the tuning step times.

The C library's ``malloc`` maps every allocation above its mmap threshold afresh and returns it to the system when
it is freed; the threshold adapts but never passes 32 MB on 64-bit glibc. So a buffer above 32 MB pays a page
fault per 4 KiB page on every call: a 78 MB conv output about 20 ms. densecnn's kernels reuse their own buffers
(``cuda_ext/output_buffers.h``) and a preloaded caching ``malloc`` (tcmalloc, jemalloc, mimalloc) reuses
everything, but the ``native`` and ``s2b`` solvers allocate through the system ``malloc``. Tuning and the
shipped cost model time candidates on bucketed shapes whose buffers mostly stay below 32 MB, so a plan adds
:func:`fresh_buffers_ms` to those solvers' times where the real layer's buffers would not. A bucketed shape whose
buffers pass 32 MB paid the page faults in its own timing, and nothing is added to it.

>>> fresh_buffers_ms("native", real_bytes=78 << 20, timed_bytes=14 << 20, train=False)  # system malloc
3.5
"""

from __future__ import annotations

import functools
from pathlib import Path

MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest mmap threshold on 64-bit (4 MiB · sizeof(long))
PAGE_FAULT_MS_PER_MB = 0.25  # first touch of fresh 4 KiB pages by two threads (0.18-0.4 measured here)
# Buffers of the output's size that each solver allocates through torch in a forward call: native its output,
# s2b the input on sub-grids, the undilated op's output and the output back in place.
TORCH_BUFFERS = {"native": 1, "s2b": 3}


@functools.cache
def name() -> str:
    """The ``malloc`` serving this process's torch tensors: "tcmalloc", "jemalloc" or "mimalloc" when one was
    preloaded, "system malloc" otherwise (or "unknown" where the process's mappings cannot be read)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return next((lib for lib in ("tcmalloc", "jemalloc", "mimalloc") if f"lib{lib}" in maps), "system malloc")


def fresh_buffers_ms(solver: str, *, real_bytes: int, timed_bytes: int, train: bool) -> float:
    """Page-fault time to add to ``solver``'s time measured or predicted on the bucketed shape, whose output has
    ``timed_bytes``, when the real layer's output has ``real_bytes``: its torch buffers mapped afresh on every call
    under the system ``malloc``, at the bucketed shape's scale (plans compare candidates there). A training step
    also allocates the input's gradient, about one more such buffer."""
    buffers = TORCH_BUFFERS.get(solver, 0) + (1 if train and solver in TORCH_BUFFERS else 0)
    if not buffers or not _mapped_beyond_timing(real_bytes, timed_bytes):
        return 0.0
    return buffers * timed_bytes / (1 << 20) * PAGE_FAULT_MS_PER_MB


def fresh_input_gradient_ms(solver: str, *, real_bytes: int, timed_bytes: int) -> float:
    """Page-fault time to add to gradient solver ``solver``'s input-gradient time (measured or predicted on the
    bucketed shape, whose input has ``timed_bytes``) when the real layer's input has ``real_bytes``: torch's
    convolution backward (``native``) allocates the input's gradient, one buffer of the input's size, through the
    system ``malloc``; the ``fft`` and ``winograd`` gradients are written into densecnn's reused buffers.

    >>> fresh_input_gradient_ms("native", real_bytes=41 << 20, timed_bytes=13 << 20)  # system malloc
    3.25
    """
    if solver != "native" or not _mapped_beyond_timing(real_bytes, timed_bytes):
        return 0.0
    return timed_bytes / (1 << 20) * PAGE_FAULT_MS_PER_MB


def _mapped_beyond_timing(real_bytes: int, timed_bytes: int) -> bool:
    """Whether the system ``malloc`` maps a real buffer of ``real_bytes`` afresh on every call and the timing on the
    bucketed shape, whose buffer of ``timed_bytes`` its heap served again, did not already pay for that."""
    return timed_bytes <= MMAP_THRESHOLD_MAX < real_bytes and name() == "system malloc"
