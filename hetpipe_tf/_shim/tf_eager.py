"""TensorFlow's eager hot path without its per-call Python (TF 2.21).

A concrete function's flat call (`pipeline/compiled.py`) and the gradient tape's C++ watch
and gradient (`pipeline/stage.py`): each a measured cut of Python per minibatch
(docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def concrete_flat_inputs(concrete: Any, args: tuple) -> list:
    """The tensors `concrete` (a ConcreteFunction) takes for `args`, as its structured call
    binds them."""
    # Reason: ConcreteFunction.__call__ binds the arguments to its FunctionType on every
    # call; `compiled.py` binds once per argument key and calls the flat function after.
    from tensorflow.python.eager.polymorphic_function import function_type_utils
    bound = function_type_utils.canonicalize_function_inputs(args, {}, concrete.function_type)
    return list(concrete.function_type.unpack_inputs(bound))


def call_concrete_flat(concrete: Any, flat: list) -> Any:
    """Call `concrete` on the flat tensors `concrete_flat_inputs` returned (the same
    structured outputs as `concrete(*args)`)."""
    # Reason: the flat call is private (`_call_flat`), the public one rebinds every time.
    return concrete._call_flat(flat, concrete.captured_inputs)


def _all_eager_tensors(tensors: list) -> bool:
    # Reason: EagerTensor, the type the C++ paths below take, is not exported.
    from tensorflow.python.framework import ops
    return all(type(t) is ops.EagerTensor for t in tensors)


def watch_flat(tape: tf.GradientTape, tensors: list) -> None:
    """`tape.watch(tensors)` for a flat list, without its per-tensor Python for eager
    tensors (anything else, e.g. a variable or a composite tensor, goes to `tape.watch`)."""
    # Reason: GradientTape.watch flattens and type-checks each tensor in Python, a share of
    # a non-last stage's forward task the size of its compiled call for small layers.
    if not _all_eager_tensors(tensors):
        tape.watch(tensors)
        return
    from tensorflow.python.eager import tape as tape_lib
    for t in tensors:
        tape_lib.watch(tape._tape, t)


def gradient_flat(tape: tf.GradientTape, targets: list, sources: list,
                  output_gradients: list) -> list:
    """`tape.gradient(targets, sources, output_gradients)` for flat lists and a
    non-persistent tape: a gradient per source, None where unconnected; releases the tape,
    as `gradient` does. Eager tensors take the tape's C++ path directly; anything else
    (variables, composite tensors) goes to `tape.gradient`."""
    # Reason: GradientTape.gradient spends most of a non-last stage's backward task in
    # Python (nest.map_structure and typing-protocol checks per tensor, about 40% of stage
    # 0's Python time for small layers); the C++ tape gradient underneath is the same.
    from tensorflow.python.eager import imperative_grad
    if tape._persistent:
        raise ValueError("gradient_flat takes a non-persistent tape (its gradient releases "
                         "the tape). Received: a persistent GradientTape.")
    if tape._recording:
        raise RuntimeError("gradient_flat needs a tape that stopped recording.")
    if tape._tape is None:
        raise RuntimeError("This tape's gradient was taken already (it is not persistent).")
    if not (_all_eager_tensors(targets) and _all_eager_tensors(sources)
            and _all_eager_tensors(output_gradients)):
        return tape.gradient(targets, sources, output_gradients=output_gradients)
    grads = imperative_grad.imperative_grad(tape._tape, targets, sources,
                                            output_gradients=output_gradients)
    tape._tape = None
    return grads
