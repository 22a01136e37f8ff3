"""What a process asks TensorFlow to run, counted by benchmarks/wire_speed.py.

TensorFlow has no public hook on its dispatch, so `observe_tf_calls` wraps its private
entry points: the one benchmark-side use of TensorFlow internals (the library's own are
behind `hetpipe_tf._shim`). Never imported by the library or by training code.
"""

from __future__ import annotations

import re
from typing import Callable


def observe_tf_calls(on_call: Callable[[str, str], None]) -> None:
    """Call `on_call(kind, name)` each time this process runs a compiled function
    ("compiled"), an eager op ("eager op"), reads a tensor to the host ("host read") or
    traces a function ("trace"); for benchmarks/wire_speed.py's calls per minibatch (on
    a chief nearly each is a remote request). Installed for good; cheap when `on_call`
    returns at once."""
    # Reason: TensorFlow has no public hook on its dispatch; these are its entry points.
    from tensorflow.python import pywrap_tfe as _pywrap_tfe
    from tensorflow.python.eager import execute
    from tensorflow.python.framework import func_graph, ops

    fast, slow, numpy = (_pywrap_tfe.TFE_Py_FastPathExecute, execute.execute,
                         ops._EagerTensorBase.numpy)
    cancelable = execute.execute_with_cancellation   # ClusterCoordinator's closures
    trace = func_graph.func_graph_from_py_func

    def fast_path(*args):
        on_call("eager op", args[1])
        return fast(*args)

    def name_of(op_name) -> str:
        # Some dispatch paths (graph-mode, ClusterCoordinator's closures) pass bytes.
        name = op_name.decode() if isinstance(op_name, bytes) else op_name
        return re.sub(r"_\d+$", "", name)

    def execute_(op_name, *args, **kwargs):
        name = name_of(op_name)
        on_call("compiled" if name.startswith("__inference") else "eager op", name)
        return slow(op_name, *args, **kwargs)

    def cancelable_(op_name, *args, **kwargs):
        on_call("compiled", name_of(op_name))
        return cancelable(op_name, *args, **kwargs)

    def numpy_(tensor):
        on_call("host read", "numpy")
        return numpy(tensor)

    def trace_(name, *args, **kwargs):
        on_call("trace", name)
        return trace(name, *args, **kwargs)

    _pywrap_tfe.TFE_Py_FastPathExecute = fast_path
    func_graph.func_graph_from_py_func = trace_
    execute.execute = execute.quick_execute = execute_
    execute.execute_with_cancellation = cancelable_
    ops._EagerTensorBase.numpy = numpy_
