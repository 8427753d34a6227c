"""CPU time read from real processes."""

from __future__ import annotations

import os

from spark_cnn.bench import cputime


def test_a_tree_snapshot_finds_a_child_and_its_cpu():
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: pass"])
    try:
        time.sleep(0.3)
        mine = [(kind, ticks) for (pid, _), (kind, ticks) in cputime.tree_snapshot(os.getpid()).processes.items()
                if pid == child.pid]
        assert mine and mine[0][0] == "other" and mine[0][1] > 0
    finally:
        child.kill()
        child.wait()
