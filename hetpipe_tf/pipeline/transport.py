"""Moving values between the tasks of a cluster job in few remote calls.

On a cluster the chief drives every stage over TensorFlow's gRPC runtime, and each remote
call costs a round trip that, on loaded cores, is worth milliseconds (docs/cluster_jobs.md,
"Speed of the wire"). Two rules follow.

- Read many scalars at once: `host_values` packs a dict of scalar tensors of one remote
  device into one vector there (one compiled call) and reads it with one `.numpy()`, instead
  of one round trip per value. The values are cast back exactly (float32, int32 and float16
  are exact in float64), so callers see what per-value reads gave.
- Who hosts a compiled call: called under `tf.device(d)` on a remote task, a `tf.function`
  is shipped to that task as one asynchronous op (cheap for the chief), but then an input
  that another task has just produced can be looked up there before it exists ("Unable to
  find the relevant tensor remote_handle", seen with w_global pulled from the ps and rebased
  on a worker). `wait_for_other_tasks` waits until such inputs exist (a remote tensor's
  shape is known once its op ran; no data moves), after which the call can be hosted on
  the task that holds its outputs. Hosting it on this process instead costs more than the
  wait: a call hosted by the chief whose outputs live on a worker ships each output to the
  chief and back (2 model sizes more on the chief's link for a rebase of the whole model,
  measured on this machine; docs/cluster_jobs.md).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from hetpipe_tf._shim import tf_executors

_PACKABLE = (tf.float16, tf.float32, tf.float64, tf.int32, tf.bool)
_TASK = re.compile(r"^/job:([^/]+)(?:/replica:\d+)?(?:/task:(\d+))?")


@tf.function(reduce_retracing=True)
def _pack(values):
    return tf.stack([tf.cast(v, tf.float64) for v in values])


def task_of(device: str) -> tuple[str, int] | None:
    """(job, task) a device string names, or None for a device of this process."""
    m = _TASK.match(device or "")
    if m is None or m.group(1) == "localhost":
        return None
    return m.group(1), int(m.group(2) or 0)


def _is_remote(device: str) -> bool:
    task = task_of(device)
    return task is not None and task != task_of(tf_executors.host_task())


def host_values(values: Mapping[str, Any]) -> dict:
    """{key: value.numpy()} for a dict of tensors; scalars of one remote device come over
    in one call."""
    items = list(values.items())
    tensors = [v for _, v in items]
    if (len(items) < 2 or not all(isinstance(v, tf.Tensor) and v.shape.rank == 0
                                  and v.dtype in _PACKABLE for v in tensors)
            or len({v.device for v in tensors}) != 1 or not _is_remote(tensors[0].device)):
        return {k: v.numpy() for k, v in items}
    with tf.device(tensors[0].device):
        packed = _pack(tensors).numpy()
    return {k: np.asarray(x).astype(v.dtype.as_numpy_dtype)[()]
            for (k, v), x in zip(items, packed)}


def wait_for_other_tasks(device: str, tensors: Sequence) -> None:
    """Block until every tensor that another remote task is producing exists there, so
    that a call hosted on `device`'s task can look it up (module docstring): reading a
    remote tensor's shape waits for the op that makes it, and moves no data."""
    task = task_of(device)
    if task is None:
        return
    here = task_of(tf_executors.host_task())
    for t in tensors:
        other = task_of(getattr(t, "device", "") or "")
        if other is not None and other not in (task, here):
            t.shape  # noqa: B018 - waits until the producing op ran
