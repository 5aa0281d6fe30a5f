"""``python -m densecnn.train ...``: the ``densecnn train`` command, as a module torchrun can launch.

torchrun --nproc-per-node 2 -m densecnn.train --model tiny --classes 3 --data DIR --out RUN
"""

import sys

from ..commands.train import main

sys.exit(main())
