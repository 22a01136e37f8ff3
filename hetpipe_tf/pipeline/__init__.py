"""The TensorFlow runtime of ONE virtual worker: the model's layer graph as stage programs,
weight versions, and the stage threads behind the `Executor` interface. No tf.distribute and
no Keras training loop here (the stages call the model's Keras layers)."""
