r"""A keras_hub backbone split across stages, as a user would try it (prints; asserts nothing).

  python -m pip install -e ".[test]"      # keras-hub is a test dependency
  python -m experiments.keras_hub_trial

This trial runs keras_hub models on 4 logical CPU devices (tests/strategy/
test_tied_weights.py tests GPT2CausalLM the same way):
1. a random-initialised `GPT2Backbone` (no download) under a Dense LM head, called with the
   dict of inputs keras_hub uses, split over 4 stages at N_m = 1 and trained for 2 epochs
   beside the same model under plain Keras: the plan table, both losses, the largest
   weight difference;
2. a `BertBackbone` (4 layers; its [CLS] slice is a bare keras.ops node) under a Dense
   classifier on `pooled_output`, the same comparison;
3. a `GemmaBackbone` (2 decoder blocks, grouped-query attention) under a Dense head, the
   same comparison;
4. keras_hub's `GPT2CausalLM` as it is (open sequence length, the token embedding tied to
   the LM head), `causal_lm.fit` over 4 stages, the last borrowing the embedding, the same
   comparison;
5. keras_hub's `BertTextClassifier` as it is (no preprocessor), over 4 stages, the same
   comparison.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

SEQ, VOCAB, DEVICES = 16, 100, 4


def _backbone(keras_hub, num_layers: int):
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=num_layers, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=SEQ, dropout=0.0)


def _inputs(keras):
    return {"token_ids": keras.Input((SEQ,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((SEQ,), dtype="int32", name="padding_mask")}


def _compare(title, build, x, y, loss, devices) -> None:
    """Train `build()` split over `devices` (N_m = 1) and beside it under plain Keras."""
    import keras
    import numpy as np

    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, devices, n_m=1))
    with strategy.scope():
        model = build()
        model.compile(keras.optimizers.Adam(1e-3), loss)
    ref = build()
    ref.set_weights(model.get_weights())
    ref.compile(keras.optimizers.Adam(1e-3), loss)
    got = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    want = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    print(f"{title}, {len(devices)} stages (logical CPU devices), N_m=1, Adam, 2 epochs")
    print(strategy.plan.table())
    print(f"loss per epoch: strategy {got.history['loss']}, plain Keras {want.history['loss']}")
    diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), ref.get_weights()))
    print(f"largest weight difference to plain Keras: {diff:.2e}\n")
    strategy.close()


def main() -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(DEVICES)])
    import keras
    import keras_hub
    import numpy as np


    def gpt():
        keras.utils.set_random_seed(0)
        inputs = _inputs(keras)
        h = _backbone(keras_hub, 4)(inputs)
        return keras.Model(inputs, keras.layers.Dense(VOCAB, name="lm_head")(h))

    def bert():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=VOCAB, num_layers=4, num_heads=2, hidden_dim=32,
            intermediate_dim=64, max_sequence_length=SEQ, dropout=0.0)
        inputs = {k: keras.Input((SEQ,), dtype="int32", name=k)
                  for k in ("token_ids", "segment_ids", "padding_mask")}
        pooled = backbone(inputs)["pooled_output"]
        return keras.Model(inputs, keras.layers.Dense(3, name="classifier")(pooled))

    def gemma():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GemmaBackbone(
            vocabulary_size=VOCAB, num_layers=2, num_query_heads=2, num_key_value_heads=1,
            hidden_dim=32, intermediate_dim=64, head_dim=16, dropout=0.0)
        inputs = _inputs(keras)
        return keras.Model(inputs, keras.layers.Dense(VOCAB, name="lm_head")(backbone(inputs)))

    rs = np.random.RandomState(0)
    tokens = rs.randint(0, VOCAB, (32, SEQ + 1)).astype("int32")
    mask = np.ones((32, SEQ), "int32")
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(DEVICES)]
    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _compare(f"1. keras_hub {keras_hub.__version__} GPT2Backbone (4 layers) + Dense head", gpt,
             {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:], sparse,
             devices)
    _compare("2. BertBackbone (4 layers) + Dense classifier on pooled_output", bert,
             {"token_ids": tokens[:, :-1], "segment_ids": np.zeros_like(mask),
              "padding_mask": mask}, rs.randint(0, 3, (32,)), sparse, devices)
    _compare("3. GemmaBackbone (2 blocks) + Dense head", gemma,
             {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:], sparse,
             devices)

    def causal_lm():
        keras.utils.set_random_seed(0)
        return keras_hub.models.GPT2CausalLM(backbone=_backbone(keras_hub, 2),
                                             preprocessor=None)

    def classifier():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=32,
            intermediate_dim=64, max_sequence_length=SEQ, dropout=0.0)
        return keras_hub.models.BertTextClassifier(backbone, num_classes=3,
                                                   preprocessor=None, dropout=0.0)

    _compare("4. GPT2CausalLM as it is (tied embedding, open sequence length)", causal_lm,
             {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:], sparse,
             devices)
    _compare("5. BertTextClassifier as it is", classifier,
             {"token_ids": tokens[:, :-1], "segment_ids": np.zeros_like(mask),
              "padding_mask": mask}, rs.randint(0, 3, (32,)), sparse, devices)


if __name__ == "__main__":
    main()
