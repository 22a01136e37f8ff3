"""The one place that reads private Keras and TensorFlow internals (Keras 3.15, TF 2.21).

Every function here wraps one private use, with a one-line reason. If a Keras or
TensorFlow upgrade breaks the partitioner, the strategy or the stages' calls, look here
first. The TensorFlow ones (the end of this file) are the pipeline's hot path: a concrete
function's flat call (`pipeline/compiled.py`) and the eager tape's C++ watch and gradient
(`pipeline/stage.py`), each a measured cut of Python per minibatch (docs/performance.md,
"Session 6").

Keras 3 exposes a Functional model's layers (`model.layers`, `model.operations`) but
not its call graph: which call of which layer consumed which tensor, with which other
arguments. `model.get_config()` has the wiring, but it serialises non-tensor call
arguments (they would have to be deserialised again to re-call a layer) and fails for
layers whose config is not serialisable, so it is not enough to execute a node range:
the graph is read through `call_events`. The rest is what the strategy's pipelined
training step needs from Keras' own `Functional.call` and `Trainer.train_step`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable

import keras
import tensorflow as tf
from tensorflow.python import pywrap_tfe as _pywrap_tfe   # own_executor
from tensorflow.python.eager import executor as _tf_executor   # own_executor


@dataclasses.dataclass(frozen=True)
class CallEvent:
    """One call of an operation inside a model (a Keras `Node`, as plain data).

    `args` / `kwargs` are the recorded call arguments with the symbolic input tensors
    (KerasTensors) in place; `outputs` is the flat tuple of output KerasTensors.
    `call_index` counts the calls of `operation` (> 0 only for shared layers).
    """

    operation: Any
    call_index: int
    args: tuple
    kwargs: dict
    outputs: tuple


def functional_graph(model: keras.Model) -> keras.Model | None:
    """The Functional model that holds `model`'s graph, or None if there is none."""
    if isinstance(model, keras.Sequential):
        # Sequential has no public graph; build() keeps an internal Functional of it.
        return getattr(model, "_functional", None)
    if isinstance(model, keras.Model) and hasattr(model, "_nodes_by_depth"):
        return model
    return None


def call_events(functional: keras.Model) -> list[CallEvent]:
    """Every non-input call of the graph, in a topological order.

    The order is Keras' own (depth from the outputs, decreasing; ties in traversal
    order), which for graphs without shared layers equals `model.operations`.
    """
    operation_rank = {id(op): k for k, op in enumerate(functional.operations)}
    # Per-call nodes of shared layers exist only in the private depth map.
    nodes_by_depth = functional._nodes_by_depth
    events = []
    for depth in sorted(nodes_by_depth, reverse=True):
        nodes = []
        for node in nodes_by_depth[depth]:
            if node.is_input:
                continue
            # A node's position among its operation's calls identifies shared calls.
            call_index = node.operation._inbound_nodes.index(node)
            nodes.append((operation_rank[id(node.operation)], call_index, node))
        nodes.sort(key=lambda item: (item[0], item[1]))
        for _, call_index, node in nodes:
            events.append(
                CallEvent(
                    operation=node.operation,
                    call_index=call_index,
                    args=tuple(node.arguments.args),
                    kwargs=dict(node.arguments.kwargs),
                    outputs=tuple(node.outputs),
                )
            )
    return events


def nested_functional(operation: Any) -> keras.Model | None:
    """The Functional graph a model used as a layer runs when called, or None when its call
    is Python code of its own (a subclassed Model, or a Functional subclass overriding call)."""
    from keras.src.models.functional import Functional

    # Reason: Functional (the class of keras.Model(inputs, outputs), of keras_hub backbones
    # and of Sequential's internal graph) is private; only its own call is a graph.
    if isinstance(operation, keras.Sequential):
        if type(operation).call is not keras.Sequential.call:
            return None
        return getattr(operation, "_functional", None)
    if isinstance(operation, Functional) and type(operation).call is Functional.call:
        return operation
    return None


def nested_inputs(functional: keras.Model, args: tuple, kwargs: dict) -> tuple[list | None, str]:
    """The recorded values a call of the nested `functional` feeds to its inputs, in the
    order of `functional.inputs`, or (None, why) when Keras' Functional.call would do more
    with them than hand them on (convert a dtype, adjust a rank, apply a mask, ...)."""
    kwargs = dict(kwargs)
    kwargs.pop("training", None)  # Functional.call passes the caller's training on, as we do
    # Layer.__call__ records the inputs' Keras masks (a structure of None when there are none).
    if all(m is None for m in keras.tree.flatten(kwargs.get("mask", None))):
        kwargs.pop("mask", None)
    if "inputs" in kwargs and not args:
        args = (kwargs.pop("inputs"),)
    if kwargs or len(args) != 1:
        extra = f"keywords {sorted(kwargs)}" if kwargs else f"{len(args)} positional arguments"
        return None, f"it is called with arguments besides its inputs ({extra})"
    inputs = args[0]
    # Reason: the mapping of a call's structure to the inputs mirrors the private
    # Functional._standardize_inputs (without its conversions, refused below).
    struct, flat_refs = functional._inputs_struct, list(functional.inputs)
    if isinstance(struct, list) and len(struct) == 1 and is_symbolic_tensor(inputs):
        inputs = [inputs]
    elif isinstance(inputs, dict) and not isinstance(struct, dict):
        names = [t.name for t in flat_refs]
        if not set(names) <= set(inputs):
            return None, f"its inputs {names} are not all in the dict given"
        inputs = [inputs[n] for n in names]
    flat = keras.tree.flatten(inputs)
    if len(flat) != len(flat_refs):
        return None, f"it gets {len(flat)} tensors for {len(flat_refs)} inputs"
    for x, ref in zip(flat, flat_refs):
        if not is_symbolic_tensor(x):
            return None, f"input {ref.name!r} is given a constant"
        if x.dtype != ref.dtype or len(x.shape) != len(ref.shape):
            return None, (f"input {ref.name!r} ({ref.dtype}, rank {len(ref.shape)}) is "
                          f"given a {x.dtype} tensor of rank {len(x.shape)} that Keras "
                          "would convert")
    return flat, ""


def output_specs(operation: Any, args: tuple, kwargs: dict) -> list:
    """The flat output specs (KerasTensors) of calling `operation` on specs, without
    recording a call in any graph (for shapes a nested model leaves undefined)."""
    return keras.tree.flatten(operation.compute_output_spec(*args, **kwargs))


def is_symbolic_tensor(value: Any) -> bool:
    """True for the symbolic tensors (KerasTensor) that wire a Functional graph."""
    return isinstance(value, keras.KerasTensor)


def keras_mask(tensor: Any) -> Any:
    """The Keras mask (Masking, Embedding(mask_zero=True), ...) a tensor carries, or None."""
    # Reason: Keras 3 keeps masks as a private tensor attribute; no public getter.
    from keras.src.backend.common.masking import get_keras_mask

    return get_keras_mask(tensor)


def set_keras_mask(tensor: Any, mask: Any) -> None:
    """Attach a Keras mask to a tensor, as a layer's call does for its outputs: a tensor that
    crossed a stage boundary (a tf.function's argument or result) has lost its mask."""
    from keras.src.backend.common.masking import set_keras_mask as _set

    _set(tensor, mask)


# --- running a Functional model's graph the way Functional.call does ----------------------
def outputs_struct(functional: keras.Model) -> Any:
    """The nesting of the model's outputs (list, dict, single tensor)."""
    # Reason: y_pred must be packed as Functional.call packs it; only kept privately.
    return functional._outputs_struct


def standardize_inputs(functional: keras.Model, x: Any) -> list:
    """The model's inputs as a flat list in the order of its Input layers."""
    # Reason: dict / list / single-tensor inputs map to Input layers as Functional does.
    return list(functional._standardize_inputs(x))


def all_layers(model: keras.Model) -> list:
    """Every layer of the model, nested ones included."""
    # Reason: model.layers lists only the top level.
    return list(model._flatten_layers(include_self=False))


# --- the parts of Keras' train_step that the pipelined step runs itself -------------------
def compile_loss(model: keras.Model) -> Any:
    """The compiled loss alone (None if the model was compiled without one)."""
    # Reason: model.compute_loss would add the regularisation losses of the live variables,
    # not of the stage's weight version.
    return model._compile_loss


def loss_tracker(model: keras.Model) -> Any:
    # Reason: the "loss" metric that Keras' own train_step updates.
    return model._loss_tracker


def compile_metrics(model: keras.Model) -> Any:
    # Reason: the compiled metrics, updated in minibatch order by the last stage.
    return model._compile_metrics


def call_overridden(model: keras.Model, name: str) -> bool:
    """Whether the model's class overrides a Trainer method (train_step, compute_loss...)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.trainers.trainer import Trainer

    # Reason: the base implementations live in these two private classes.
    impl = getattr(type(model), name, None)
    return impl is not None and impl not in (
        getattr(TensorFlowTrainer, name, None),
        getattr(Trainer, name, None),
    )


def variable_handle(v: Any) -> Any:
    """The tf.Variable behind a Keras variable."""
    # Reason: tf.Variable is what ops, devices and copy-on-write snapshots work on.
    return v.value if isinstance(v, keras.Variable) else v


# --- optimizers ------------------------------------------------------------------------------
def optimizer_learning_rate(optimizer: Any) -> Any:
    """The optimizer's learning-rate object: a Variable, a schedule or a callable."""
    # Reason: `optimizer.learning_rate` evaluates a schedule; the VWs must share the object.
    return optimizer._learning_rate


def set_optimizer_learning_rate(optimizer: Any, value: Any) -> None:
    """Make `optimizer` use `value` (another optimizer's Variable or schedule) as is."""
    # Reason: the public setter assigns a float into the optimizer's own variable instead.
    optimizer._learning_rate = value


def calling_model(frame: Any, methods: tuple[str, ...] = ("compile",)) -> Any:
    """The Keras model one of whose `methods` is running in `frame` or a frame above it."""
    # Reason: compile() creates the loss tracker's variables in the strategy's scope, the
    # first moment the strategy can see the model (to guard fit against aborts); fit()
    # distributes its dataset before Keras builds the optimizer (to check it first).
    while frame is not None:
        if frame.f_code.co_name in methods:
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.Model):
                return owner
        frame = frame.f_back
    return None


def fit_first_batch(frame: Any, need_batch: bool = True) -> tuple[int | None, Any]:
    """(batch size, first batch) of the data the running `fit` iterates (its epoch
    iterator's data adapter), where the traced batch leaves a dimension open: NumPy inputs
    with a remainder, Python generators, `keras.utils.PyDataset`, a tf.data dataset batched
    without drop_remainder or padded to each batch's longest sequence. The batch size is
    the adapter's when it knows it, else the first batch's; (None, None) when no fit runs in
    `frame` or above it, or the data yields no batch. With `need_batch=False` the first
    batch is read only when the batch size needs it (None is returned for it otherwise)."""
    # Reason: the plan is made for the user's batch size and input shapes, which Keras
    # knows but does not put into the traced step's shapes when they vary.
    while frame is not None and not (frame.f_code.co_name == "fit"
                                     and "epoch_iterator" in frame.f_locals):
        frame = frame.f_back   # past a subclass's own fit that calls Keras' fit
    iterator = None if frame is None else frame.f_locals["epoch_iterator"]
    adapter = getattr(iterator, "data_adapter", None)
    if adapter is None:
        return None, None
    if not need_batch and isinstance(adapter.batch_size, int):
        return adapter.batch_size, None
    first = getattr(adapter, "_first_batches", None)          # Python generator: peeked
    if first is None and getattr(adapter, "py_dataset", None) is not None:
        first = [adapter.py_dataset[0]]                        # as Keras reads it for specs
    if first is None:
        with tf.init_scope():    # NumPy and tf.data: a fresh pass of the dataset it made
            first = [element for element in adapter.get_tf_dataset().take(1)]
    size = adapter.batch_size
    if not isinstance(size, int):
        sizes = [int(t.shape[0]) for batch in first or ()
                 for t in tf.nest.flatten(batch) if getattr(t, "shape", None)]
        size = max(sizes) if sizes else None
    return size, (first[0] if first else None)


def pythonify_logs(logs: Any) -> dict:
    """Logs as `train_on_batch` returns them (Python floats, nested dicts flattened)."""
    # Reason: the strategy recomputes train_on_batch's logs after draining the pipeline.
    from keras.src.utils.python_utils import pythonify_logs as pythonify
    return pythonify(logs)


def flatten_logs(model: Any, logs: dict) -> Any:
    """Logs as a list in the order of `model.metrics_names` (train_on_batch's default)."""
    # Reason: the same; Keras' own ordering of its return value.
    return model._flatten_metrics_in_order(logs)


def stand_in_for(copy: Any, original: Any) -> None:
    """Give a virtual worker's tf.Variable copy of a model variable the model variable's
    Keras `path`, which some optimizers read to choose their rule per variable (Muon's
    exclude_layers)."""
    # Reason: Keras optimizers expect Keras Variables; the copies are plain tf.Variables.
    copy.path = getattr(original, "path", original.name)


def is_auto_named(variable: Any) -> bool:
    """Whether Keras named the variable by a counter ("variable", "variable_3"), as an
    optimizer's own state made without a name (Nadam's u_product), not a slot named after
    the model variable it belongs to."""
    # Reason: Keras gives unnamed variables "variable" plus a per-process counter, so two
    # optimizers' copies of the same state carry different names.
    return re.fullmatch(r"variable(_\d+)?", variable.name) is not None


def optimizer_strategy(optimizer: Any) -> Any:
    """The tf.distribute strategy the optimizer was created under."""
    # Reason: Keras keeps it privately; an optimizer made outside our scope must be refused
    # before Keras builds its slots (TensorFlow's own error there names no fix).
    return getattr(optimizer, "_distribution_strategy", None)


def building_optimizer(frame: Any) -> Any:
    """The Keras optimizer whose slot variables are being created in `frame` or above."""
    # Reason: the model's own optimizer keeps its slots on the host (the stages train with
    # optimizers of their own); Keras builds it at fit's symbolic build, not when we ask.
    while frame is not None:
        if frame.f_code.co_name == "add_variable_from_reference":
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.optimizers.Optimizer):
                return owner
        frame = frame.f_back
    return None


def write_by_value(optimizer: Any, variables: Any) -> None:
    """Make `optimizer` update `variables` as `v.assign(v - x)` (a new buffer that the
    variable adopts) instead of `v.assign_sub(x)` (in place), for dense values. Same values,
    bit for bit. While a weight version still shares a variable's buffer, in place means
    copy-on-write: a full copy, then the update over it (3.5 vs 1.9 ms for 13 x 512x512
    variables on this project's machine, docs/performance.md)."""
    # Reason: Keras optimizers write through their own assign_add / assign_sub methods
    # (public, for backend-specific writes); the instance's pair is replaced, not the class's.
    ids = {id(variable_handle(v)) for v in variables}
    in_place_add, in_place_sub = optimizer.assign_add, optimizer.assign_sub

    def by_value(in_place, op):
        def write(variable, value):
            handle = variable_handle(variable)
            if id(handle) not in ids or isinstance(value, tf.IndexedSlices):
                return in_place(variable, value)
            handle.assign(op(handle, tf.cast(value, handle.dtype)))
        return write

    optimizer.assign_add = by_value(in_place_add, tf.add)
    optimizer.assign_sub = by_value(in_place_sub, tf.subtract)


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


def host_task() -> str:
    """This process's task, e.g. "/job:chief/replica:0/task:0" ("/job:localhost/..." when
    not connected): TensorFlow has no public way to ask, and once connected
    `tf.config.list_logical_devices()` lists every task's devices (pipeline/transport.py)."""
    from tensorflow.python.eager import context

    return context.context().host_address_space()


@contextlib.contextmanager
def own_executor() -> Any:
    """A context manager: this thread's eager ops run in an executor of their own (sync).

    After a remote task dies, TensorFlow's shared default executor keeps waiting for it
    and every later remote op issued from it blocks; the same op in another executor
    runs. TensorFlow's own ClusterCoordinator gives each worker thread one executor for
    the same reason (`context.executor_scope(executor.new_executor(enable_async=False))`,
    tensorflow/python/distribute/coordinator/cluster_coordinator.py). Public TF has no
    per-thread executor, hence private `context` / `executor`.

    Not TF's `executor_scope` itself: it reads the previous executor as a new Python
    wrapper and drops it at exit, and `Executor.__del__` waits for every op pending in
    that executor: the process's default one, where a remote op of another thread for a
    frozen task (SIGSTOP) never ends, so every thread leaving its own executor hung (the
    chief; tests/ps/test_continue.py). That wrapper is dropped here without the wait (it
    never owns the executor it points to). On leaving, a lost task's error left in this
    executor is cleared: the thread has already raised or dropped it, and `__del__` would
    print it as "Exception ignored ... UnavailableError" at exit.
    """
    from tensorflow.python.eager import context, executor

    own = executor.new_executor(enable_async=False)
    ctx = context.context()
    previous = ctx.executor   # a wrapper that does not own the executor
    previous.__class__ = _UnwaitedExecutor
    ctx.executor = own
    try:
        yield own
    finally:
        try:
            own.wait()
        except tf.errors.OpError:
            own.clear_error()
        ctx.executor = previous


class _UnwaitedExecutor(_tf_executor.Executor):
    """A wrapper of an executor it does not own: dropped without waiting for its ops."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            _pywrap_tfe.TFE_DeleteExecutor(self._handle)   # the wrapper only
        except TypeError:   # interpreter shutdown, as Executor.__del__
            pass


# --- benchmarks: what a process asks TensorFlow to run --------------------------------------
def observe_tf_calls(on_call: Callable[[str, str], None]) -> None:
    """Call `on_call(kind, name)` each time this process runs a compiled function
    ("compiled"), an eager op ("eager op"), reads a tensor to the host ("host read") or
    traces a function ("trace"); for benchmarks/wire_speed.py's calls per minibatch (on
    a chief nearly each is a remote request). Installed for good; cheap when `on_call`
    returns at once."""
    # Reason: TensorFlow has no public hook on its dispatch; these are its entry points.
    import re

    from tensorflow.python.eager import execute
    from tensorflow.python.framework import func_graph, ops

    fast, slow, numpy = (_pywrap_tfe.TFE_Py_FastPathExecute, execute.execute,
                         ops._EagerTensorBase.numpy)
    trace = func_graph.func_graph_from_py_func

    def fast_path(*args):
        on_call("eager op", args[1])
        return fast(*args)

    def execute_(op_name, *args, **kwargs):
        kind = "compiled" if op_name.startswith("__inference") else "eager op"
        on_call(kind, re.sub(r"_\d+$", "", op_name))
        return slow(op_name, *args, **kwargs)

    def numpy_(tensor):
        on_call("host read", "numpy")
        return numpy(tensor)

    def trace_(name, *args, **kwargs):
        on_call("trace", name)
        return trace(name, *args, **kwargs)

    _pywrap_tfe.TFE_Py_FastPathExecute = fast_path
    func_graph.func_graph_from_py_func = trace_
    execute.execute = execute.quick_execute = execute_
    ops._EagerTensorBase.numpy = numpy_
