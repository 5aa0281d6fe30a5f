#!/usr/bin/env python
"""Fine-tune a model on your own labelled images: ``densecnn train`` with fine-tuning defaults.

    python scripts/finetune.py --data my_data/train --val my_data/val --out runs/mine

Defaults (each can be overridden by passing the option again): ``--model models/nuclei --epochs 10 --lr 3e-4
--crop 128 --batch 4 --crops-per-image 16``. Any other ``densecnn train`` option passes through; see
``densecnn train --help``.
"""

import sys

from densecnn.cli import main

DEFAULTS = ["--model", "models/nuclei", "--epochs", "10", "--lr", "3e-4", "--crop", "128", "--batch", "4"]
DEFAULTS += ["--crops-per-image", "16"]

if __name__ == "__main__":
    # argparse keeps the last value of a repeated option, so the user's options override these defaults
    sys.exit(main(["train", *DEFAULTS, *sys.argv[1:]]))
