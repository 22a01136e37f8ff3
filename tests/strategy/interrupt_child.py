"""Child process of test_interrupt.py: trains until SIGINT arrives, then checks the state.

Prints "training" once minibatches flow, then a JSON line with what it found after the
KeyboardInterrupt: whether anything moved after fit raised, the counters, and whether a
resumed fit trained and left no thread behind.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from hetpipe_tf.strategy import HetPipeStrategy, even_plan  # noqa: E402
from tests.strategy.helpers import DEVICES, regression_data, skip_model  # noqa: E402


def main(vws: int) -> None:
    x, y = regression_data(4096, 0)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[2 * w:2 * w + 2], n_m=3) for w in range(vws)]
    strategy = HetPipeStrategy(plan=plans if vws > 1 else plans[0], clock_distance=1)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.Adam(1e-3), "mse")
    announce = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: b == 20 and print("training", flush=True))
    try:
        model.fit(x, y, batch_size=8, epochs=1000, verbose=0, callbacks=[announce])
        print(json.dumps({"interrupted": False}), flush=True)
        return
    except KeyboardInterrupt:
        pass
    runtimes = [strategy.pipeline(model, w) for w in range(vws)]
    weights = model.get_weights()
    iterations = int(model.optimizer.iterations.numpy())
    time.sleep(0.5)
    moved = any(not np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    completed = sum(rt.completed for rt in runtimes)
    in_flight = sum(rt.in_flight for rt in runtimes)
    history = model.fit(x[:256], y[:256], batch_size=8, epochs=1, verbose=0)
    strategy.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("hetpipe-")]
    print(json.dumps({
        "interrupted": True, "moved_after_raise": moved, "iterations": iterations,
        "completed": completed, "in_flight": in_flight,
        "iterations_after_resume": int(model.optimizer.iterations.numpy()),
        "resumed_loss": history.history["loss"][-1], "threads_left": left}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
