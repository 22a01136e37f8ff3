"""The one place that reads private Keras and TensorFlow internals (Keras 3.15, TF 2.21).

Each function wraps one private use, with a one-line reason, in a module named after what
it reaches into. If a Keras or TensorFlow upgrade breaks the partitioner, the strategy or
the stages' calls, look here first:

- `keras_graph`: a Functional model's call graph, inputs, outputs and masks;
- `keras_trainer`: compile's loss and metrics, the running compile / fit, fit's logs;
- `keras_optimizer`: Keras variables and optimizers (learning rate, slots, updates);
- `tf_eager`: a concrete function's flat call and the tape's C++ watch and gradient;
- `tf_executors`: this process's task and an eager executor per thread.

Modules inside `hetpipe_tf` import the submodule they need; this package also offers
every function under its own name (`from hetpipe_tf import _shim`).
"""

from hetpipe_tf._shim.keras_graph import (CallEvent, all_layers, call_events, functional_graph,
                                          is_symbolic_tensor, keras_mask, nested_functional,
                                          nested_inputs, output_specs, outputs_struct,
                                          set_keras_mask, standardize_inputs)
from hetpipe_tf._shim.keras_optimizer import (building_optimizer, is_auto_named,
                                              optimizer_learning_rate, optimizer_strategy,
                                              set_optimizer_learning_rate, stand_in_for,
                                              variable_handle, write_by_value)
from hetpipe_tf._shim.keras_trainer import (build_from_element_spec, call_overridden,
                                            calling_model, compile_loss, compile_metrics,
                                            dataset_batch_size, fit_first_batch, fit_verbose,
                                            flatten_logs, loss_tracker, print_msg,
                                            pythonify_logs)
from hetpipe_tf._shim.tf_eager import (call_concrete_flat, concrete_flat_inputs,
                                       gradient_flat, watch_flat)
from hetpipe_tf._shim.tf_executors import host_task, own_executor

__all__ = [
    "all_layers", "build_from_element_spec", "building_optimizer", "call_concrete_flat",
    "call_events", "call_overridden", "CallEvent", "calling_model", "compile_loss",
    "compile_metrics", "concrete_flat_inputs", "dataset_batch_size", "fit_first_batch",
    "fit_verbose", "flatten_logs", "functional_graph", "gradient_flat", "host_task",
    "is_auto_named", "is_symbolic_tensor", "keras_mask", "loss_tracker",
    "nested_functional", "nested_inputs", "optimizer_learning_rate", "optimizer_strategy",
    "output_specs", "outputs_struct", "own_executor", "print_msg", "pythonify_logs",
    "set_keras_mask", "set_optimizer_learning_rate", "stand_in_for", "standardize_inputs",
    "variable_handle", "watch_flat", "write_by_value",
]
