"""keras.applications.ResNet50 (weights=None, small input): skip connections and
BatchNorm across the stage boundary, under fit / evaluate / predict."""

import keras
import numpy as np

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES


def test_resnet50_two_stages():
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:2], n_m=2))
    with strategy.scope():
        model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=4)
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    rs = np.random.RandomState(0)
    x = rs.rand(16, 32, 32, 3).astype("float32")
    y = rs.randint(0, 4, (16,))
    w0 = [w.copy() for w in model.get_weights()]
    hist = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(hist.history["loss"][0])
    rt = strategy.pipeline(model)
    assert rt.completed == 4 and rt.in_flight == 0
    # The cut between the stages carries a residual branch as well as the main path.
    assert len(rt.stages[0].out_refs) == 2
    changed = sum(not np.array_equal(a, b) for a, b in zip(w0, model.get_weights()))
    assert changed > 0.9 * len(w0)
    assert model.predict(x[:4], verbose=0).shape == (4, 4)
    strategy.close()
