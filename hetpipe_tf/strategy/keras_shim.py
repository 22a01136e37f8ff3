"""Every use of a private Keras 3 internal by the strategy, each with a one-line reason.

Keras 3.15 (tf.keras in TF 2.21). If a Keras upgrade breaks the strategy, look here first.
"""

from __future__ import annotations

from typing import Any

import keras


def functional_graph(model):
    """The Functional graph of a model (Sequential models keep one in `_functional`)."""
    # Reason: the runtime calls layers one by one; Sequential has no public graph accessor.
    if isinstance(model, keras.Sequential):
        fn = getattr(model, "_functional", None)
        if fn is None:
            raise ValueError(
                "The Sequential model is not built, so its layer graph is unknown. Received: "
                f"model={model.name!r} without an input shape; start it with keras.Input(...) "
                "or build it before fit.")
        return fn
    if hasattr(model, "_nodes_by_depth") and hasattr(model, "_outputs_struct"):
        return model
    raise ValueError(
        "HetPipeStrategy runs Sequential and Functional models (a subclassed model has no "
        f"layer graph to cut into stages). Received: model of class {type(model).__name__}; "
        "build the model with the Functional API or keras.Sequential.")


def nodes_by_depth(fn) -> dict:
    # Reason: the graph's call nodes (with their argument structure) are only kept here.
    return fn._nodes_by_depth


def outputs_struct(fn) -> Any:
    # Reason: packing y_pred the way Functional.call does (nested outputs, unpacked singleton).
    return fn._outputs_struct


def pack_outputs(struct: Any, flat):
    out = keras.tree.pack_sequence_as(struct, list(flat))
    if isinstance(out, (list, tuple)) and len(out) == 1:  # Functional's unpack_singleton
        return out[0]
    return out


def call_context_args(layer) -> set:
    # Reason: Functional injects `training` only into layers that declare it here.
    return getattr(layer, "_call_context_args", set()) or set()


def standardize_inputs(model, x):
    # Reason: dict / list / single-tensor inputs map to Input layers the way Functional does.
    fn = functional_graph(model)
    return fn._standardize_inputs(x)


def compile_loss(model):
    # Reason: the last stage needs the compiled loss alone; model.compute_loss would add
    # every layer's regularisation losses read from the live variables, not the version.
    return model._compile_loss


def loss_tracker(model):
    # Reason: the "loss" metric that Keras' own train_step updates.
    return model._loss_tracker


def compile_metrics(model):
    # Reason: compiled metrics updated in minibatch order by the last stage.
    return model._compile_metrics


def call_overridden(model, name: str) -> bool:
    """Whether the model's class overrides a Trainer method (train_step, compute_loss...)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.trainers.trainer import Trainer
    # Reason: the base implementations live in these two private classes.
    impl = getattr(type(model), name, None)
    return impl is not None and impl not in (getattr(TensorFlowTrainer, name, None),
                                             getattr(Trainer, name, None))


def variable_handle(v):
    """The tf.Variable behind a Keras variable."""
    # Reason: tf.Variable is what ops, devices and copy-on-write snapshots work on.
    return v.value if isinstance(v, keras.Variable) else v


def all_layers(model) -> list:
    # Reason: every nested layer (model.layers lists only the top level).
    return list(model._flatten_layers(include_self=False))
