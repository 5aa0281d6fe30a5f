"""Peak memory of a tiled ``predict`` on a large image, measured in a fresh process (the whole process's peak RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, time, torch, densecnn

    def peak_rss():  # bytes; VmHWM is this process's own peak, ru_maxrss also counts the parent if it was larger
        try:
            line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
            return int(line.split()[1]) * 1024
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    name, size, max_memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=32)
    dense = densecnn.convert(model.eval(), patch)
    x = torch.rand(1, 3, size, size)
    start = time.perf_counter()
    labels = dense.predict(x, max_memory=max_memory)
    seconds = time.perf_counter() - start
    print(json.dumps({
        "peak_rss_bytes": peak_rss(),
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": seconds,
        "labels_shape": list(labels.shape),
    }))
    """
)


def tiled_predict_peak(model: str, size: int, max_memory: int) -> dict:
    """Run ``predict(x, max_memory)`` on a random size×size RGB image in a fresh process; report its peak RSS."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, model, str(size), str(max_memory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    return {"model": model, "image": [1, 3, size, size], "max_memory": max_memory, **measured}
