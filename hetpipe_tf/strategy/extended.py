"""The tf.distribute side of `HetPipeStrategy`: its `StrategyExtended`.

Keras 3 `model.fit` calls `strategy.run(model.train_step, ...)` inside a tf.function; the
extended's `_call_for_each_replica` sees the model's bound `train_step` and replaces it by a
`tf.py_function` that hands the batch to the model's executor (returning at once unless N_m
minibatches are in flight and one more waits) and returns the loss and compiled metrics as
of the last completed minibatch; one stage at N_m = 1 instead puts the stage's own ops into
the step (`InGraphRuntime`, no py_function; the step itself is `step.py`).
`test_step`/`predict_step` (evaluate, predict, validation) first drain the pipeline and
then run on the live weights.

It also places the variables Keras creates in the scope (on their stage's device when a
plan is given, the model optimizer's slots on the host), passes datasets through as they
are (one virtual worker takes the user's batches), and acts as one replica for reductions
and updates. Every option is the frozen `options` (options.py); per model it keeps the
`Training` that `build.py` made (its executor, its `Layout`). The model's wrappers are
`guards.py`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.cluster.local import host_cpu_device
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.strategy.build import (Training, build_training, changed_without_compile,
                                       compiled_state, fix_open_inputs, same_compile)
from hetpipe_tf.strategy.guards import guard_model, install_draining_metrics
from hetpipe_tf.strategy.layout import Layout
from hetpipe_tf.strategy.options import StrategyOptions
from hetpipe_tf.strategy.plans import layer_devices
from hetpipe_tf.strategy.step import (bound_step, from_keras_or_tf, identity_or_keep,
                                      submitting_step)
from hetpipe_tf.strategy.validation import check_same_batch


class HetPipeExtended(tf.compat.v1.distribute.StrategyExtended):
    """tf.distribute plumbing and per-model state; every option is `options`, frozen.

    Nothing writes an attribute of this object after its constructor: per-model state lives
    in the dicts made here (a model's `Training`, its `Layout`, its trace)."""

    def __init__(self, container, options: StrategyOptions, task=None):
        super().__init__(container)
        self.options = options
        self.task = task   # this process's cluster task (roles.dispatch; None: local job)
        plan = options.layout.plan
        # One plan given: the model's variables are created on their stage devices.
        # Otherwise they stay on the host (several VWs each have copies).
        self._device_of_layer: dict[str, str] = {} if plan is None else layer_devices(plan)
        self._last_stage_device = None if plan is None else plan.stages[-1].tf_device
        self.pipelines: dict[int, Training] = {}
        # Per model: its layout, made at its first fit and kept across re-compiles.
        self._layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._traced: dict[int, InGraphRuntime | None] = {}   # per model, at its last trace
        # Per model: is its Keras train function being called after its first call (so a
        # trace now is a retrace, which tf.function lets create no variables)?
        self._called_before: dict[int, bool] = {}
        self._lock = threading.RLock()
        self._runtime_threads: set[int] = set()
        self._local_placement = threading.local()
        self._guarded = weakref.WeakSet()   # models whose fit etc. this strategy guards
        # Per model: a batch refused inside a step (py_function), for the guard to re-raise.
        self.refused: dict[int, BaseException] = {}

    # --- variables ----------------------------------------------------------------------
    @property
    def _host(self) -> str:
        # Resolved when used: the process may connect to a cluster after building us.
        return host_cpu_device()

    @property
    def _fallback_device(self) -> str:
        """Where variables of no stage go (metrics, optimizer counters)."""
        return self._last_stage_device or self._host

    def _device_for_scope(self, scope: str) -> str:
        parts = scope.split("/")
        for end in range(len(parts), 0, -1):   # the innermost layer scope first
            for start in range(end):           # its longest path first
                key = "/".join(parts[start:end])
                if key in self._device_of_layer:
                    return self._device_of_layer[key]
        return self._fallback_device

    @contextlib.contextmanager
    def place_locally(self):
        """Within this context, variables keep the caller's device scope (w_global on the
        parameter servers, w_local on the stage devices)."""
        self._local_placement.on = True
        try:
            yield
        finally:
            self._local_placement.on = False

    def _create_variable(self, next_creator, **kwargs):
        if getattr(self._local_placement, "on", False):
            kwargs.pop("colocate_with", None)
            return next_creator(**kwargs)
        compiling = _keras_shim.calling_model(sys._getframe(1))
        if compiling is not None:
            self.guard_model(compiling)
        colocate_with = kwargs.pop("colocate_with", None)
        if colocate_with is not None and self._builds_a_model_optimizer(sys._getframe(1)):
            # The model's own optimizer is the between-runs state (docs/state.md): the
            # stages train with clones of it, so its slots stay on the host.
            with tf.device(self._host):
                return next_creator(**kwargs)
        if colocate_with is not None:  # optimizer slots follow their variable
            with tf.device(colocate_with.device):
                return next_creator(**kwargs)
        with tf.device(self._device_for_scope(tf.get_current_name_scope())):
            return next_creator(**kwargs)

    def _builds_a_model_optimizer(self, frame) -> bool:
        optimizer = _keras_shim.building_optimizer(frame)
        return optimizer is not None and any(
            getattr(m, "optimizer", None) is optimizer for m in list(self._guarded))

    def _validate_colocate_with_variable(self, colocate_with_variable):
        del colocate_with_variable

    # --- input: one virtual worker takes the user's batches as they are ------------------
    def _experimental_distribute_dataset(self, dataset, options):
        del options
        fitting = _keras_shim.calling_model(sys._getframe(1), ("fit",))
        if fitting is not None:
            self._check_compiled_here(fitting)
            _keras_shim.build_from_element_spec(fitting)   # no extra pass over the data
        return dataset

    def _check_compiled_here(self, model) -> None:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            return
        owner = _keras_shim.optimizer_strategy(optimizer)
        if owner is not self._container_strategy():
            raise ValueError(
                "The model was compiled outside HetPipeStrategy.scope(), so its optimizer "
                f"belongs to another strategy. Received: optimizer {optimizer.name!r} created "
                f"under {type(owner).__name__}; call compile() inside "
                "`with strategy.scope():`.")

    def _distribute_datasets_from_function(self, dataset_fn, options):
        del options
        return dataset_fn(tf.distribute.InputContext())

    def _experimental_distribute_values_from_function(self, value_fn):
        return value_fn(tf.distribute.experimental.ValueContext())

    # --- the step ---------------------------------------------------------------------------
    def _call_for_each_replica(self, fn, args, kwargs):
        model, name = bound_step(fn)
        if model is None and not from_keras_or_tf(fn):
            # A custom training loop: the pipeline (stages, weight versions, the parameter
            # servers) is built from a Keras model's own step, which this function is not.
            raise NotImplementedError(
                "HetPipeStrategy pipelines a model only inside Keras' fit/evaluate/predict; "
                "strategy.run with your own step function is not supported (its gradients "
                "and optimizer updates would bypass the pipeline). Received: strategy.run("
                f"{getattr(fn, '__name__', fn)!r}); train with model.fit, the loss and metrics "
                "given to compile() and extra loss terms through layers' add_loss (a model "
                "overriding train_step is refused too; docs/strategy.md, 'Custom training "
                "loops').")
        if model is not None and name == "train_step":
            return self._pipelined_train_step(model, args, kwargs)
        ctx = tf.distribute.ReplicaContext(self._container_strategy(), 0)
        drained = tf.py_function(self._drain_for_step, [], Tout=tf.bool)
        with tf.control_dependencies([drained]), ctx:
            args = tf.nest.map_structure(identity_or_keep, args)
            return fn(*args, **kwargs)

    def _drain_for_step(self):
        self.drain()
        return True

    def _pipelined_train_step(self, model, args, kwargs):
        if kwargs:
            raise ValueError(f"train_step takes one argument. Received: kwargs={kwargs}.")
        (data,) = args
        runtime = self._runtime_for(model, data)
        training = self.pipelines[id(model)]
        # What the train function being traced runs: its wrapper binds to it.
        self._traced[id(model)] = runtime if isinstance(runtime, InGraphRuntime) else None
        if isinstance(runtime, InGraphRuntime):   # no py_function: ops of Keras' step
            x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
            return runtime.step(training.program.model_inputs(x), y, sw)
        return submitting_step(runtime, training, data,
                               refuse=lambda e: self.refused.__setitem__(id(model), e))

    def _runtime_for(self, model, data):
        with self._lock:
            t = self.pipelines.get(id(model))
            if t is not None and not same_compile(t.compiled, compiled_state(model)):
                if self._called_before.get(id(model)):
                    raise ValueError(changed_without_compile(model, t.compiled))
                # compile() was called again: rebuild on the new optimizer, loss, metrics and
                # trainable flags. The old runtime is drained, so the model holds its state.
                with tf.init_scope():
                    t.executor.close()
                self._runtime_threads.difference_update(t.executor.thread_ids)   # reusable idents
                del self.pipelines[id(model)]
                t = None
            if t is not None:
                check_same_batch(data, t.batch_size)
                fix_open_inputs(model, data, sys._getframe(1))   # larger inputs: refused
                return t.executor
            # The last trace's runtime is gone (re-compile), or a dead model's whose
            # id was reused: the wrapper binds to the one built now.
            self._traced.pop(id(model), None)
            t = self._build_runtime(model, data)
            self.pipelines[id(model)] = t
            self._layouts.pop(model, None)   # re-inserted: the last built comes last
            self._layouts[model] = t.layout
            self._runtime_threads.update(t.executor.thread_ids)
            install_draining_metrics(self, model, t.metrics_result)
            return t.executor

    def _build_runtime(self, model, data) -> Training:
        return build_training(self.options, model, data,
                              strategy=self._container_strategy(),
                              layout=self._layouts.get(model),
                              place_locally=self.place_locally, guard_model=self.guard_model)

    # --- read-only views of the options and the layouts made -----------------------------
    def layout(self) -> Layout | None:
        """The layout of the model built last (None before a first fit)."""
        layouts = list(self._layouts.values())
        return layouts[-1] if layouts else None

    @property
    def plans(self) -> tuple:
        """The plans given, else those made at the last model's first fit (else ())."""
        made = self.layout()
        return self.options.layout.plans or (made.plans if made is not None else ())

    @property
    def plan(self):
        return self.plans[0] if len(self.plans) == 1 else None

    @property
    def n_m(self) -> int | None:
        made = self.layout()
        return made.n_m if made is not None else self.options.pipeline.n_m

    @property
    def compensation(self):
        return self.options.compensation.value

    @property
    def clock_distance(self) -> int:
        """D of the model trained last (the planner may pick it under a cluster model);
        the one given, or 0, before a model was laid out."""
        made = self.layout()
        return made.clock_distance if made is not None else self.options.wsp.clock_distance

    # --- the model's own calls: abort on failure, drain before reading state -------------
    def guard_model(self, model) -> None:
        """Install the model's wrappers (hetpipe_tf/strategy/guards.py), once."""
        guard_model(self, model)

    def abort(self, model) -> BaseException | None:
        """Stop `model`'s executor after a failed call (module docstring); returns the error
        of the stage that failed, if one did."""
        t = self.pipelines.get(id(model))
        if t is None:
            return None
        error = t.executor.error
        with tf.init_scope():
            t.executor.abort()
        return error

    def drain(self) -> None:
        if threading.get_ident() in self._runtime_threads:
            return
        for t in list(self.pipelines.values()):
            t.executor.drain()

    def close(self) -> None:
        with self._lock:
            for t in self.pipelines.values():
                t.executor.close()

    # --- reductions and updates: one replica ----------------------------------------------
    def _reduce_to(self, reduce_op, value, destinations, options):
        del reduce_op, destinations, options
        return value

    def _gather_to_implementation(self, value, destinations, axis, options):
        del destinations, axis, options
        return value

    def _broadcast_to(self, tensor, destinations):
        del destinations
        return tensor

    def _update(self, var, fn, args, kwargs, group):
        if not self.pipelines and threading.get_ident() not in self._runtime_threads:
            # The optimizer belongs to this strategy but Keras' own train_step is applying
            # it: the model was built outside scope(), so fit() bypasses the pipeline.
            raise ValueError(
                "An optimizer created in HetPipeStrategy.scope() is updating variables "
                "outside the pipeline: the model was not created inside the scope, so "
                "model.fit would train it without the strategy. Received: update of "
                f"{var.name!r} from Keras' own train_step; create the model and call "
                "compile() inside `with strategy.scope():`.")
        with tf.device(var.device):
            result = fn(var, *args, **kwargs)
        return result if group else tf.nest.map_structure(self._local_results, result)

    def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
        del colocate_with
        result = fn(*args, **kwargs)
        return result if group else tf.nest.map_structure(self._local_results, result)

    def _use_merge_call(self):
        return False

    def read_var(self, replica_local_var):
        return tf.identity(replica_local_var)

    def _local_results(self, value):
        return (value,)

    def value_container(self, value):
        return value

    def _in_multi_worker_mode(self):
        return False

    @property
    def _num_replicas_in_sync(self):
        return 1

    @property
    def worker_devices(self):
        return (self._host,)

    @property
    def parameter_devices(self):
        if self.plan is None:
            return (self._host,)
        return tuple(s.tf_device for s in self.plan.stages)

    def non_slot_devices(self, var_list):
        del var_list
        return (self._fallback_device,)

    @property
    def experimental_should_init(self):
        return True

    @property
    def experimental_between_graph(self):
        return False

    @property
    def should_checkpoint(self):
        return True

    @property
    def should_save_summary(self):
        return True

    @property
    def _global_batch_size(self):
        return True

    @property
    def _support_per_replica_values(self):
        return False

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group
