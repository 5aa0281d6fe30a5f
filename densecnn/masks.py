"""Pixel-selection strategies: which pixels' errors a whole-image training step counts.

Each strategy is called on a batch's labels and returns a bool mask of their shape for
:func:`densecnn.masked_cross_entropy`: (N, H, W) for images, (N, L) for signals, (N, D, H, W) for volumes, where
"per image" means per sample (per signal, per volume). Pixels labelled ``ignore_index`` are never selected.
Random choices come from the ``generator`` you pass, so a step is reproducible.

>>> g = torch.Generator().manual_seed(0)
>>> strategy = densecnn.masks.parse("hard:256:0.25")    # the CLI's --mask syntax
>>> scores = dense(images)                              # (N, K, H, W), the forward pass of this step
>>> mask = strategy(labels, pixel_loss=densecnn.losses.pixel_cross_entropy(scores, labels), generator=g)
>>> densecnn.masked_cross_entropy(scores, labels, mask).backward()

Strategies:
- ``all()``: every labelled pixel.
- ``random(k)``: k pixels per image, uniformly among the labelled ones.
- ``balanced(k)``: k pixels per class per image (all of them where a class has fewer).
- ``hard(k, mix=0.5)``: per image, ``round(k·mix)`` pixels uniformly at random and the other ones with the
  largest current error (``pixel_loss``, read off the forward pass already done: no extra forward): online hard
  example mining with a random share (Shrivastava, Gupta & Girshick, "Training Region-based Object Detectors with
  Online Hard Example Mining").
- ``proportional(k)``: k pixels per image drawn without replacement with probability proportional to their current
  loss, so every pixel keeps a chance (Loshchilov & Hutter, "Online Batch Selection for Faster Training of Neural
  Networks"; Katharopoulos & Fleuret, "Not All Samples Are Created Equal"). Drawn as the top k of
  ``log(loss) + Gumbel noise`` (Gumbel-top-k).
Where an image has fewer than k eligible pixels, all of them are selected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import InvalidInputError
from .losses import IGNORE_INDEX


@dataclass(frozen=True)
class MaskStrategy:
    """A pixel-selection strategy: build one with :func:`all`, :func:`random`, :func:`balanced`, :func:`hard`,
    :func:`proportional` or :func:`parse`."""

    kind: str
    k: int = 0
    mix: float = 0.0

    @property
    def needs_loss(self) -> bool:
        """Whether the strategy ranks pixels by ``pixel_loss`` (``hard`` and ``proportional`` do)."""
        return self.kind in ("hard", "proportional")

    def __call__(
        self,
        labels: torch.Tensor,
        *,
        pixel_loss: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> torch.Tensor:
        """(N, *spatial) labels (and, for ``hard``, their per-pixel loss, same shape) -> (N, *spatial) bool mask."""
        if not 2 <= labels.dim() <= 4:
            raise InvalidInputError(
                f"labels must be (N, L), (N, H, W) or (N, D, H, W), got shape {tuple(labels.shape)}"
            )
        eligible = labels != ignore_index  # (N, *spatial)
        if self.kind == "all":
            return eligible
        if self.kind == "random":
            return _top_k(_random_keys(labels, generator), eligible, self.k)
        if self.kind == "balanced":
            keys = _random_keys(labels, generator)
            mask = torch.zeros_like(eligible)
            for value in labels[eligible].unique():
                mask |= _top_k(keys, labels == value, self.k)
            return mask
        if pixel_loss is None or tuple(pixel_loss.shape) != tuple(labels.shape):
            raise InvalidInputError(
                f"{self.kind}(k) needs pixel_loss, the per-pixel loss of the forward pass just done, shaped like "
                "the labels"
            )
        if self.kind == "proportional":
            uniform = _random_keys(labels, generator).double().clamp(min=1e-300)
            gumbel = -torch.log(-torch.log(uniform))  # (N, *spatial)
            weight = pixel_loss.detach().double().clamp(min=1e-30)  # a zero loss keeps a vanishing chance
            return _top_k(weight.log() + gumbel, eligible, self.k)
        n_random = round(self.k * self.mix)
        hardest = _top_k(pixel_loss.detach().float(), eligible, self.k - n_random)
        return hardest | _top_k(_random_keys(labels, generator), eligible & ~hardest, n_random)

    def __str__(self) -> str:
        if self.kind == "all":
            return "all"
        return f"hard:{self.k}:{self.mix:g}" if self.kind == "hard" else f"{self.kind}:{self.k}"


def proportional(k: int) -> MaskStrategy:
    """Select ``k`` pixels per image at random with probability proportional to their current loss."""
    return MaskStrategy("proportional", _check_k(k))


def all() -> MaskStrategy:
    """Select every labelled pixel."""
    return MaskStrategy("all")


def random(k: int) -> MaskStrategy:
    """Select ``k`` labelled pixels per image, uniformly at random."""
    return MaskStrategy("random", _check_k(k))


def balanced(k: int) -> MaskStrategy:
    """Select ``k`` pixels of each class present in each image (all of a class's pixels if it has fewer)."""
    return MaskStrategy("balanced", _check_k(k))


def hard(k: int, mix: float = 0.5) -> MaskStrategy:
    """Select ``k`` pixels per image: ``round(k·mix)`` at random, the others with the largest current loss."""
    if not 0.0 <= mix <= 1.0:
        raise InvalidInputError(
            f"hard(k, mix): mix is the share of random pixels and must be in [0, 1], got {mix}"
        )
    return MaskStrategy("hard", _check_k(k), float(mix))


# kind -> (builder, its required and optional arguments in the ``--mask`` syntax): the one list of kinds
KINDS = {
    "all": (all, (), ()),
    "random": (random, ("K",), ()),
    "balanced": (balanced, ("K",), ()),
    "hard": (hard, ("K",), ("MIX",)),
    "proportional": (proportional, ("K",), ()),
}
SYNTAX = " | ".join(
    kind + "".join(f":{a}" for a in required) + "".join(f"[:{a}]" for a in optional)
    for kind, (_, required, optional) in KINDS.items()
)
SYNTAX += "  (K pixels per image, MIX in [0, 1] the random share)"


def parse(text: str) -> MaskStrategy:
    """A strategy from the CLI syntax ``all | random:K | balanced:K | hard:K[:MIX] | proportional:K``.

    >>> densecnn.masks.parse("hard:128:0.25")
    MaskStrategy(kind='hard', k=128, mix=0.25)
    """
    parts = str(text).strip().lower().split(":")
    kind, args = parts[0], parts[1:]
    if kind not in KINDS:
        raise InvalidInputError(f"unknown mask strategy {text!r}; use {SYNTAX}")
    build, required, optional = KINDS[kind]
    if not len(required) <= len(args) <= len(required) + len(optional):
        raise InvalidInputError(f"mask strategy {text!r} has the wrong number of arguments; use {SYNTAX}")
    try:
        values = [int(args[0])] + [float(a) for a in args[1:]] if args else []
    except ValueError:
        raise InvalidInputError(
            f"mask strategy {text!r}: K must be an integer and MIX a number; use {SYNTAX}"
        ) from None
    return build(*values)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k (pixels per image) must be a positive integer, got {k!r}")
    return k


def _random_keys(labels: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(N, *spatial) uniform random keys in [0, 1): ranking by them picks a uniform random subset."""
    keys = torch.rand(
        labels.shape, generator=generator, device="cpu" if generator is None else generator.device
    )
    return keys.to(labels.device)


def _top_k(keys: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """Per sample, the (up to) ``k`` eligible pixels with the largest keys, as an (N, *spatial) bool mask."""
    n = keys.shape[0]
    flat_eligible = eligible.reshape(n, -1)  # (N, pixels)
    k = min(k, flat_eligible.shape[1])
    if k == 0:
        return torch.zeros_like(eligible)
    ranked = keys.reshape(n, -1).masked_fill(~flat_eligible, float("-inf"))  # (N, pixels)
    chosen = ranked.topk(k, dim=1).indices  # (N, k)
    mask = torch.zeros_like(flat_eligible)
    mask.scatter_(1, chosen, flat_eligible.gather(1, chosen))  # drop picks that were not eligible (too few)
    return mask.view_as(eligible)
