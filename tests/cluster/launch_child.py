"""The program tests/cluster/test_launch.py runs under the launcher (no TensorFlow: fast).

The chief prints its TF_CONFIG task and then does argv[1]: "exit0", "exit3", "sleep"
(until stopped), "grandchild" (starts a sleeping child process of its own, prints its
pid, then sleeps), "trap" (on SIGINT prints "SIGINT at <time>", takes 1 s as a chief
stopping at a minibatch boundary would, prints "exits at <time>" and exits 0) or "deaf"
(ignores SIGINT). Workers and parameter servers print "serving" and sleep until stopped,
as `HetPipeStrategy(...)` does in them; under "trap" and "deaf" they print
"SIGTERM at <time>" when stopped. Times are `time.time()`, comparable across processes.
"""

import json
import os
import signal
import subprocess
import sys
import time


def _say_and_exit(name: str, busy_s: float):
    def handler(signum, frame):
        print(f"{name} at {time.time():.3f}", flush=True)
        time.sleep(busy_s)
        print(f"exits at {time.time():.3f}", flush=True)
        sys.exit(0)
    return handler


def main() -> None:
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    print(f"task {task['type']}:{task['index']} pid={os.getpid()} "
          f"devices={json.dumps(config['hetpipe']['devices'])}", flush=True)
    action = sys.argv[1]
    if task["type"] != "chief":
        if action in ("trap", "deaf"):
            signal.signal(signal.SIGTERM, _say_and_exit("SIGTERM", 0.0))
        print("serving", flush=True)
        while True:
            time.sleep(60)
    if action == "trap":
        signal.signal(signal.SIGINT, _say_and_exit("SIGINT", 1.0))
    if action == "deaf":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if action == "exit0":
        print("done", flush=True)
        return
    if action == "exit3":
        print("failing", file=sys.stderr, flush=True)
        sys.exit(3)
    if action == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"grandchild pid={child.pid}", flush=True)
    print("sleeping", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
