"""The program tests/cluster/test_launch.py runs under the launcher (no TensorFlow: fast).

The chief prints its TF_CONFIG task and then does argv[1]: "exit0", "exit3", "sleep"
(until stopped) or "grandchild" (starts a sleeping child process of its own, prints its
pid, then sleeps). Workers and parameter servers print "serving" and sleep until stopped,
as `HetPipeStrategy(...)` does in them.
"""

import json
import os
import subprocess
import sys
import time


def main() -> None:
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    print(f"task {task['type']}:{task['index']} pid={os.getpid()} "
          f"devices={json.dumps(config['hetpipe']['devices'])}", flush=True)
    if task["type"] != "chief":
        print("serving", flush=True)
        while True:
            time.sleep(60)
    action = sys.argv[1]
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
