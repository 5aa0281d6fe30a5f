"""Compare two label maps (palette PNGs of class ids): exit 0 when equal, else 1 with the differing pixels.

python scripts/compare_labels.py container.png host.png
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from PIL import Image


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels", help="a label map")
    parser.add_argument("reference", help="the label map it must equal")
    args = parser.parse_args()
    labels, reference = (np.asarray(Image.open(path)) for path in (args.labels, args.reference))
    if labels.shape != reference.shape:
        print(f"label maps differ in shape: {labels.shape} vs {reference.shape}", file=sys.stderr)
        return 1
    differing = int(np.count_nonzero(labels != reference))
    classes, counts = np.unique(reference, return_counts=True)
    summary = ", ".join(f"class {c}: {n}" for c, n in zip(classes.tolist(), counts.tolist()))
    if differing:
        print(f"label maps differ in {differing} of {reference.size} pixels", file=sys.stderr)
        return 1
    print(f"label maps equal: {reference.size} pixels ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
