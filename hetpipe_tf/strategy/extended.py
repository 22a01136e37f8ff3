"""The tf.distribute side of `HetPipeStrategy`: its `StrategyExtended`.

Keras 3 `model.fit` calls `strategy.run(model.train_step, ...)` inside a tf.function; the
extended's `_call_for_each_replica` sees the model's bound `train_step` and replaces it by a
`tf.py_function` that hands the batch to the model's executor (returning at once unless N_m
minibatches are in flight and one more waits) and returns the loss and compiled metrics as
of the last completed minibatch; one stage at N_m = 1 instead puts the stage's own ops into
the step (`InGraphRuntime`, no py_function). `test_step`/`predict_step` (evaluate, predict,
validation) first drain the pipeline and then run on the live weights.

It also places the variables Keras creates in the scope (on their stage's device when a
plan is given, the model optimizer's slots on the host), passes datasets through as they
are (one virtual worker takes the user's batches), and acts as one replica for reductions
and updates. Building a model's executor is `build.py`; the model's wrappers, `guards.py`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import weakref

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.cluster.local import host_cpu_device
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.strategy.build import (Training, build_training, changed_without_compile,
                                       compiled_state, fix_open_inputs, same_compile)
from hetpipe_tf.strategy.guards import guard_model
from hetpipe_tf.strategy.validation import (check_batch_fits, check_n_m, check_plans,
                                            check_same_batch)


class HetPipeExtended(tf.compat.v1.distribute.StrategyExtended):
    data_parallel = None   # a strategy.hetseq.DataParallel, set by HetPipeStrategy
    shares = None          # HetSeq shares given by hand (tuple of ints) or None
    compensation_by_default = False   # the user gave no compensation (set by the strategy)

    def __init__(self, container, cluster, plan, n_m, max_m, clock_distance=0,
                 placement="default", ps_hosts=None, allocation=None,
                 num_virtual_workers=None, fresh_pulls=True, in_graph=True,
                 compensation="none"):
        from hetpipe_tf.cluster.allocation import AllocationPolicy
        from hetpipe_tf.strategy.compensation import Compensation
        from hetpipe_tf.ps.placement import PlacementPolicy

        super().__init__(container)
        self._cluster_arg = cluster
        self._plan_fn = plan if callable(plan) else None
        if plan is None or callable(plan):
            self.plans: tuple = ()
        else:
            self.plans = (plan,) if isinstance(plan, Plan) else check_plans(plan)
        # One plan: its variables are created on their stage devices. Several VWs: the
        # model's variables stay on the host (each VW has copies).
        self.plan = self.plans[0] if len(self.plans) == 1 else None
        self.n_m = n_m if n_m is not None else (self.plans[0].n_m if self.plans else None)
        # Checked here, not first at the fit that plans: bad input fails before any work.
        for field, value in (("max_m", max_m), ("num_virtual_workers", num_virtual_workers)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{field} must be an int >= 1 or None. Received: "
                                 f"{field}={value!r}; pass a positive int, or None for the "
                                 "default.")
        self.max_m = max_m
        if (not self.plans and self._plan_fn is None and cluster is None
                and not os.environ.get("TF_CONFIG")):
            raise ValueError(
                "HetPipeStrategy needs the virtual worker's devices. Received: cluster=None, "
                "plan=None and no TF_CONFIG; pass a cluster (hetpipe_tf.cluster) or a plan.")
        if self.n_m is not None:
            for p in self.plans or (None,):
                check_n_m(self.n_m, max_m, p)
        if (isinstance(clock_distance, bool) or not isinstance(clock_distance, int)
                or clock_distance < 0):
            raise ValueError("clock_distance (WSP's D) must be an int >= 0. Received: "
                             f"clock_distance={clock_distance!r}; use 0 for BSP-like waves.")
        self.clock_distance = clock_distance
        self.placement = PlacementPolicy.parse(placement)
        self.ps_hosts = None if ps_hosts is None else tuple(ps_hosts)
        self.allocation = None if allocation is None else AllocationPolicy.parse(allocation)
        self.num_virtual_workers = num_virtual_workers
        if not isinstance(fresh_pulls, bool):
            raise ValueError("fresh_pulls must be True or False. Received: "
                             f"fresh_pulls={fresh_pulls!r}.")
        self.fresh_pulls = fresh_pulls
        if not isinstance(in_graph, bool):
            raise ValueError(f"in_graph must be True or False. Received: in_graph={in_graph!r}.")
        self.in_graph = in_graph
        # None: the strategy's default, resolved by HetPipeStrategy once the data-parallel
        # mode is known (BOTH, or NONE in HetSeq mode).
        self.compensation = Compensation.parse(
            "none" if compensation is None else compensation)
        if self.allocation is not None and (self.plans or self._plan_fn is not None):
            raise ValueError(
                "allocation forms virtual workers for the planner; it cannot be combined with "
                f"a plan. Received: allocation={self.allocation.name} and a plan; pass one "
                "plan per virtual worker, or no plan.")
        self._device_of_layer: dict[str, str] = {}
        if self.plan is not None:
            for s in self.plan.stages:
                for name in s.layer_names:
                    # A nested model's layer "backbone/block/dense" builds its variables
                    # under a name scope ending in "dense" (or "block/dense"): any suffix.
                    parts = name.split("@")[0].split("/")
                    for i in range(len(parts)):
                        self._device_of_layer.setdefault("/".join(parts[i:]), s.tf_device)
        self._last_stage_device = (self.plan.stages[-1].tf_device if self.plan is not None
                                   else None)
        self.pipelines: dict[int, Training] = {}
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
        model, name = _bound_step(fn)
        if model is None and not _from_keras_or_tf(fn):
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
            args = tf.nest.map_structure(_identity_or_keep, args)
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
        flat = tf.nest.flatten(data)
        present = [i for i, t in enumerate(flat) if t is not None]
        structure = data
        spec = training.metrics_result()  # traced only for the logs' names, dtypes, shapes
        keys = list(spec.keys())
        dtypes = [tf.as_dtype(spec[k].dtype) for k in keys]
        shapes = [spec[k].shape for k in keys]
        np_dtypes = [d.as_numpy_dtype for d in dtypes]
        program = training.program
        # An open batch dimension (an epoch's remainder, generators): each batch is checked
        # against the planned size when it arrives; smaller ones run as they are.
        open_batch = any(flat[i].shape.rank and flat[i].shape[0] is None for i in present)

        def submit(*tensors):
            full = [None] * len(flat)
            for i, t in zip(present, tensors):
                full[i] = t
            if open_batch and tensors and tensors[0].shape.rank:
                try:
                    check_batch_fits(int(tensors[0].shape[0]), training.batch_size)
                except ValueError as e:   # re-raised as itself by the guarded fit
                    self.refused[id(model)] = e
                    raise
            batch = tf.nest.pack_sequence_as(structure, full)
            x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
            runtime.submit(program.model_inputs(x), y, sw)
            logs = runtime.logs
            if logs is None:
                return [tf.zeros(s, d) for s, d in zip(shapes, dtypes)]
            # Host values (`_set_logs`): handed back as NumPy, no eager cast op per metric.
            return [np.asarray(logs[k], d) for k, d in zip(keys, np_dtypes)]

        out = tf.py_function(submit, [flat[i] for i in present], Tout=dtypes)
        for t, s in zip(out, shapes):
            t.set_shape(s)
        return dict(zip(keys, out))

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
                self._runtime_threads -= t.executor.thread_ids   # idents may be reused
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
            return t.executor

    def _build_runtime(self, model, data) -> Training:
        return build_training(self, model, data)

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

    def _cluster_or_none(self):
        if self._cluster_arg is None and not os.environ.get("TF_CONFIG"):
            return None
        from hetpipe_tf.strategy.planning import resolve_cluster
        return resolve_cluster(self._cluster_arg)

    def _make_plans(self, model, batch_size) -> tuple:
        from hetpipe_tf.strategy.planning import plan_virtual_workers, plan_with_partitioner
        if self.data_parallel is not None and self.data_parallel.value == "hetseq":
            from hetpipe_tf.strategy.hetseq import one_device_plans   # D > 0 (docs/hetseq.md)
            return one_device_plans(model, batch_size, self._cluster_arg)
        if self.allocation is None:
            from hetpipe_tf.strategy.schedules import sync_memory
            return plan_with_partitioner(model, batch_size, self._cluster_arg, self.n_m,
                                         self.max_m, sync=sync_memory(self),
                                         compensation=self.compensation)
        return plan_virtual_workers(model, batch_size, self._cluster_arg, self.allocation,
                                    self.num_virtual_workers, self.n_m, self.max_m,
                                    compensation=self.compensation)

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


def _identity_or_keep(t):
    return tf.identity(t) if isinstance(t, tf.Tensor) else t


def _from_keras_or_tf(fn) -> bool:
    """Whether `fn` is Keras' or TensorFlow's own (Keras' predict runs a closure of its own
    around predict_step), not a user's step function."""
    module = getattr(inspect.unwrap(fn), "__module__", None) or ""
    return module.split(".")[0] in ("keras", "tensorflow", "tf_keras")


def _bound_step(fn):
    """(model, method name) when fn is a Keras model's bound step method, else (None, None)."""
    f = fn
    for _ in range(5):
        self_ = getattr(f, "__self__", None)
        if isinstance(self_, keras.Model):
            return self_, getattr(f, "__name__", None)
        nxt = getattr(f, "__wrapped__", None)
        if nxt is None:
            break
        f = nxt
    return None, None
