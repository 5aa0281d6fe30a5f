"""The Train panel's classes field: one ``name #rrggbb`` per class, comma-separated, in the order of the stroke
values (value 1 is class 0). The names and colours go into the saved model; the colours also paint the strokes layer
and the live layer. No Qt here.

>>> parse_classes("background #000000, cell #3cc85a")
(['background', 'cell'], [[0, 0, 0], [60, 200, 90]])
>>> format_classes(["background", "cell"], [[0, 0, 0], [60, 200, 90]])
'background #000000, cell #3cc85a'
>>> check_painted(["background", "cell"], [1, 2])  # every class painted, no other value
"""

from __future__ import annotations

import re

from ..errors import InvalidInputError
from ..modelfile import default_palette

_ENTRY = re.compile(r"^(?P<name>.*?)\s*(?:#(?P<colour>[0-9a-fA-F]{6}))?$")


def parse_classes(text: str) -> tuple[list[str], list[list[int]]]:
    """(names, palette) of the field's text; a class without a colour gets the default palette's.

    Raises:
        InvalidInputError: an entry has no name, or a colour is not six hexadecimal digits.
    """
    entries = [entry.strip() for entry in text.split(",")] if text.strip() else []
    fallback = default_palette(len(entries))
    names, palette = [], []
    for k, entry in enumerate(entries):
        match = _ENTRY.match(entry)
        if match is None or not match["name"] or "#" in match["name"]:
            raise InvalidInputError(
                f"class {k + 1} of the classes field ({entry!r}) is not 'name #rrggbb': write each class as a "
                "name, optionally followed by its colour, e.g. 'background #000000, cell #3cc85a'"
            )
        names.append(match["name"])
        colour = match["colour"]
        palette.append([int(colour[i : i + 2], 16) for i in (0, 2, 4)] if colour else fallback[k])
    return names, palette


def format_classes(names: list[str], palette: list[list[int]]) -> str:
    """The field's text for ``names`` and their ``palette`` (RGB 0-255)."""
    return ", ".join(f"{name} #{r:02x}{g:02x}{b:02x}" for name, (r, g, b) in zip(names, palette))


def fresh_classes(values: list[int]) -> tuple[list[str], list[list[int]]]:
    """Names and colours for a new model whose strokes use ``values`` (1-based): as many classes as the highest
    value (at least two), named ``class_1`` ... after their stroke values, in the default palette."""
    count = max([2, *values])
    return [f"class_{v}" for v in range(1, count + 1)], default_palette(count)


def check_painted(names: list[str], values: list[int]) -> None:
    """Refuse strokes that do not paint the classes field's classes for a new model: a stroke value past the field's
    classes, or a class no stroke paints (a new model never learns a class it sees no pixel of).

    Raises:
        InvalidInputError: naming the values and classes, and the fix.
    """
    beyond = [v for v in values if v > len(names)]
    if beyond:
        raise InvalidInputError(
            f"strokes are painted with value {', '.join(map(str, beyond))} but the classes field lists "
            f"{len(names)} classes: add a class to the field for each value, or repaint those strokes"
        )
    unpainted = [k for k in range(len(names)) if k + 1 not in values]
    if unpainted:
        shown = ", ".join(f"{k + 1} ({names[k]})" for k in unpainted)
        raise InvalidInputError(
            f"no strokes are painted with value {shown}, and a new model learns only the classes it sees: paint "
            "some, or take the class out of the classes field and repaint the later classes' strokes one value lower"
        )
