"""Time from `slotd examples demo` on a fresh SLOTD_HOME (no database yet) to the first task
done, as a newcomer would see it:

    python tests/bench/first_task.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time


def main() -> None:
    home = tempfile.mkdtemp(prefix="slotd-fresh-")
    shutil.rmtree(home)
    env = {**os.environ, "SLOTD_HOME": home, "SLOTD_METRICS_ADDR": "off"}
    env.pop("SLOTD_DATABASE_URL", None)
    env.pop("DATABASE_URL", None)
    began = time.perf_counter()
    demo = subprocess.Popen(
        ["slotd", "examples", "demo"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert demo.stderr is not None
        for line in demo.stderr:
            if "success in" in line:
                took = time.perf_counter() - began
                print(f"first task done {took:.2f}s after `slotd examples demo` (fresh home)")
                break
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(30)
        subprocess.run(["slotd", "embedded", "stop"], env=env, check=False)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
