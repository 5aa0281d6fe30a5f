"""What a block-wise run did (:class:`Summary`): what :func:`densecnn.blockwise.predict_to_disk` returns and reports as it
goes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import DenseCNNError, OptionSpelling, keyword_option
from .worker import TaskResult


@dataclass
class Summary:
    """What a prediction did: pixels/s, chunks (or images) computed and skipped, retries, failures."""

    what: str  # "chunks" or "images"
    total: int = 0
    computed: int = 0
    reruns: int = 0  # tasks Dask ran again by itself, having lost the worker running them
    background: int = 0  # of the computed: chunks labelled background without a forward pass
    skipped: int = 0
    retries: int = 0
    pixels: int = 0
    seconds: float = 0.0
    workers: int = 1
    failures: list[tuple[str, DenseCNNError]] = field(default_factory=list)  # (image or block, why)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (input or image, what): a constant image
    dashboard: str | None = None

    def add(self, result: TaskResult) -> None:
        """Count a finished task's ``result``: its outputs and pixels, or its image's failure, and its warning."""
        if result.error is not None:
            self.failures.append((result.item, result.error))
        if result.warning is not None:
            self.warnings.append((result.item, result.warning))
        self.computed += result.outputs
        self.background += result.background
        self.pixels += result.pixels

    @property
    def pixels_per_second(self) -> float:
        return self.pixels / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return self.render()

    def render(self, spell: OptionSpelling = keyword_option) -> str:
        """The summary, failures' fixes naming options as ``spell`` writes them (:mod:`densecnn.errors`)."""
        lines = [
            f"{self.computed} of {self.total} {self.what} computed"
            + (f" ({self.background} of them background, without a forward pass)" if self.background else "")
            + f", {self.skipped} already written, {self.retries} retries"
            + (f", {self.reruns} re-run after a lost worker" if self.reruns else "")
            + f", {len(self.failures)} failed",
            f"{self.pixels:,} pixels in {self.seconds:.1f} s: {self.pixels_per_second:,.0f} pixels/s "
            f"on {self.workers} worker{'s' * (self.workers != 1)}",
        ]
        for what, error in self.failures:
            why = error.render(spell)
            lines.append(f"failed: {why if why.startswith(str(what)) else f'{what}: {why}'}")
        return "\n".join(lines)
