"""Compensation's cost per minibatch (`time_to_accuracy --mode=cost`): one stage's weight
bookkeeping (take a version, apply an update) per compensation, timed."""

from __future__ import annotations

import time


def cost_table(device: str, compensations, width: int, layers: int, rounds: int = 300
               ) -> list[tuple[str, ...]]:
    """ms per minibatch of one stage's take + apply, per compensation (median of 5)."""
    import numpy as np
    import keras
    import tensorflow as tf

    from hetpipe_tf.pipeline.weights import StageWeights
    from hetpipe_tf.strategy.compensation import (Compensation, optimizer_adjustment,
                                                  predictor_factory)

    w, k = width, layers
    rows = [("compensation", "ms per minibatch", "vs none")]
    base = None
    for c in compensations:
        comp = Compensation.parse(c)
        with tf.device(device):
            variables = [keras.Variable(np.random.RandomState(i).randn(w, w).astype("float32")
                                        * 0.01) for i in range(k)]
        opt = keras.optimizers.SGD(1e-3, momentum=0.9)
        opt.build(variables)
        adjust = optimizer_adjustment(comp, 2, num_vws=2)   # a stage of one of 2 VWs
        if adjust is not None:
            adjust(opt)
        sw = StageWeights(device, variables, [], opt, n_m=2,
                          predictor=predictor_factory(comp, 2, 2)(device))
        grads = [tf.ones((w, w)) * 1e-3 for _ in range(k)]
        sw.start_run(1, 0)
        times = []
        for r in range(5):
            q0 = sw.applied
            t0 = time.perf_counter()
            for q in range(q0 + 1, q0 + rounds + 1):
                sw.take(q + 1)           # minibatch q + 1's version (missing update q)
                sw.apply(q, grads, [])   # w_local += u_q, version of q + 2
            times.append((time.perf_counter() - t0) / rounds * 1e3)
        ms = float(np.median(times))
        base = base or ms
        rows.append((c, f"{ms:.3f}", f"{ms / base:.2f}x"))
    return rows
