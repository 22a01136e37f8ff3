"""The setup the paper ran on (TensorFlow 1.12, CUDA 10.0, Horovod; Section 8.1), as
documented facts: each a named constant with its source (docs/cluster_model.md).

`PaperSetup` gathers them; `PAPER_SETUP` is the reproduction (Horovod's all-reduce on the
CPU, its install default, at the rate Horovod's own benchmark measured), `NCCL_SETUP` the
same with Horovod over NCCL, `NOMINAL_SETUP` the model before these facts, `WHAT_IF_SETUP`
a labelled what-if fitted to the paper's own Horovod cells (NOT the reproduction). Used by
`experiments.paper`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

from hetpipe_tf.cluster.catalog import get_device_type
from hetpipe_tf.cluster.spec import INFINIBAND_56G_BANDWIDTH, PCIE3_X16_BANDWIDTH
from hetpipe_tf.partitioner.comm import DEFAULT_INTRA_SCALE
from hetpipe_tf.partitioner.profile import ModelProfile
from hetpipe_tf.sim.allreduce import HOROVOD_CPU, HorovodConfig
from hetpipe_tf.sim.calibration import plain_update_s, without_update_costs
from hetpipe_tf.sim.scenario import single_device_samples_per_s
from hetpipe_tf.sim.network import (IB_FDR_ACHIEVED_BANDWIDTH, TF_GRPC_STREAM_BANDWIDTH,
                                    NetworkConfig)

BATCH_SIZE = 32
PAPER_TYPES = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")

MIB = 2**20
GIB = 2**30

# Link constants of the cluster model, with their sources: hetpipe_tf/sim/network.py and
# docs/cluster_model.md.
TF_GRPC_BANDWIDTH = TF_GRPC_STREAM_BANDWIDTH
# GPU memory a process's CUDA context (driver, kernels of CUDA/cuDNN/cuBLAS) takes before
# TF allocates anything: "around 300MB to 400MB" per process at CUDA init (pytorch/pytorch
# #20532, 2019, CUDA 10); 200-700 MB by machine (pytorch/pytorch#28113, CUDA 10.1).
CUDA_CONTEXT_BYTES = 400 * MIB


def tf112_gpu_memory_limit(total_bytes: int, context_bytes: int = CUDA_CONTEXT_BYTES) -> int:
    """Bytes TF 1.12's GPU allocator may use on a GPU of `total_bytes` (default options).

    TF 1.12 common_runtime/gpu/gpu_device.cc: available = free memory after the CUDA
    context; MinSystemMemory(available) = 225 MiB if available < 2 GiB, else
    max(300 MiB, 0.05 x available); the allocator gets available - that.
    """
    available = total_bytes - context_bytes
    if available <= 0:
        raise ValueError(f"The CUDA context does not fit the GPU. Received: "
                         f"total_bytes={total_bytes}, context_bytes={context_bytes}.")
    reserve = 225 * MIB if available < 2 * GIB else max(300 * MIB, int(available * 0.05))
    return available - reserve if reserve < available else available


# Which forward tensors TF's gradient functions read (tensorflow/python/ops/nn_grad.py,
# math_grad.py, array_grad.py of TF 1.x): Conv2D/MatMul read their input (and filter),
# FusedBatchNorm reads x, MaxPool reads its input and output, Relu/Softmax/Sigmoid/Tanh/Elu
# read their own output; Add, Pad, Reshape, Mean (global pooling) and AvgPool read shapes
# only. A layer's output is kept for the backward pass iff a consumer's gradient reads its
# input or the layer's own gradient reads its output. Unknown layer classes keep their
# output (the conservative old rule).
_GRAD_READS_INPUT = frozenset({"Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D",
                               "SeparableConv2D", "Dense", "BatchNormalization",
                               "LayerNormalization", "MaxPooling1D", "MaxPooling2D",
                               "MaxPooling3D"})
_GRAD_READS_OUTPUT_CLASSES = frozenset({"MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
                                        "Softmax", "ReLU", "ELU"})
_ACTIVATIONS_READING_OUTPUT = frozenset({"relu", "softmax", "sigmoid", "tanh", "elu"})
_GRAD_READS_NOTHING = frozenset({"Add", "Subtract", "Average", "Concatenate", "ZeroPadding1D",
                                 "ZeroPadding2D", "ZeroPadding3D", "Flatten", "Reshape",
                                 "GlobalAveragePooling1D", "GlobalAveragePooling2D",
                                 "GlobalAveragePooling3D", "AveragePooling1D",
                                 "AveragePooling2D", "AveragePooling3D", "InputLayer",
                                 "Permute", "Cropping2D"})


def backward_kept_bytes(nodes: Sequence[Any], activation_name: Sequence[str | None]
                        ) -> list[int]:
    """Per node, bytes per sample of its outputs that the backward pass keeps (rule above).

    nodes: `LayerGraph.nodes` (class_name, inputs, output_bytes); activation_name[i]: the
    name of node i's `activation` attribute ("relu", "linear", ...) or None.
    """
    kept: set[tuple[int, int]] = set()
    for node, act in zip(nodes, activation_name):
        cls = node.class_name
        if cls in _GRAD_READS_INPUT:
            kept.update((r.node, r.index) for r in node.inputs if r.node >= 0)
        reads_output = (cls in _GRAD_READS_OUTPUT_CLASSES
                        or (act in _ACTIVATIONS_READING_OUTPUT))
        unknown = (cls not in _GRAD_READS_INPUT and cls not in _GRAD_READS_OUTPUT_CLASSES
                   and cls not in _GRAD_READS_NOTHING and cls != "Activation")
        if reads_output or unknown:
            kept.update((node.index, k) for k in range(len(node.output_shapes)))
    return [sum(n.output_bytes(k) for k in range(len(n.output_shapes))
                if (n.index, k) in kept) for n in nodes]


def with_kept_activations(profile: ModelProfile, kept_per_sample: Sequence[int]) -> ModelProfile:
    """`profile` whose activation_bytes are `kept_per_sample` x its batch size."""
    if len(kept_per_sample) != len(profile.layers):
        raise ValueError(f"Need one byte count per layer. Received: {len(kept_per_sample)} "
                         f"for {len(profile.layers)} layers.")
    layers = tuple(dataclasses.replace(l, activation_bytes=int(k) * profile.batch_size)
                   for l, k in zip(profile.layers, kept_per_sample))
    return dataclasses.replace(profile, layers=layers)


@dataclasses.dataclass(frozen=True)
class PaperSetup:
    """How the paper's testbed is modelled (module doc); every field is printed.

    intra_bandwidth: a host's PCIe (the partitioner and the PS links use it x 0.7).
    inter_bandwidth: bytes/s of a TF tensor transfer between hosts (activations, PS).
    tf_gpu_memory: GPUs offer `tf112_gpu_memory_limit` bytes (else their whole memory).
    plan_kept_activations: HetPipe's plans count only the activations the backward pass
      keeps (else every layer's output, as the paper's measured per-layer memory did).
    horovod_kept_activations: the same choice for Horovod's memory check.
    horovod: the Horovod model (None = the no-overlap bound on the cluster's links).
    """

    name: str = "TF 1.12 setup"
    intra_bandwidth: float = PCIE3_X16_BANDWIDTH
    inter_bandwidth: float = TF_GRPC_BANDWIDTH
    tf_gpu_memory: bool = True
    cuda_context_bytes: int = CUDA_CONTEXT_BYTES
    plan_kept_activations: bool = False
    horovod_kept_activations: bool = True
    horovod: HorovodConfig | None = HOROVOD_CPU
    network: NetworkConfig | None = NetworkConfig()

    def describe(self) -> list[str]:
        gb = 1e9
        lines = [f"Setup '{self.name}' (constants and sources: docs/paper_reproduction.md):",
                 f"  PCIe inside a host: {self.intra_bandwidth / gb:.2f} GB/s x "
                 f"{DEFAULT_INTRA_SCALE} (paper Section 7, Paleo scaling-down constant) "
                 f"= {self.intra_bandwidth * DEFAULT_INTRA_SCALE / gb:.2f} GB/s "
                 "(activations inside a host, PS on the same host)"]
        src = ("TF_GRPC_BANDWIDTH, tensorflow#6116" if self.inter_bandwidth == TF_GRPC_BANDWIDTH
               else "nominal 56 Gb/s InfiniBand" if self.inter_bandwidth
               == INFINIBAND_56G_BANDWIDTH else "WHAT-IF value")
        lines.append(f"  TF tensor transfer across hosts: {self.inter_bandwidth / gb:.2f} GB/s "
                     f"({src}; activations across hosts, PS on another host)")
        if self.tf_gpu_memory:
            limit = [tf112_gpu_memory_limit(get_device_type(t).memory_bytes,
                                            self.cuda_context_bytes) for t in PAPER_TYPES]
            mem = ", ".join(f"{t} {b / GIB:.2f}" for t, b in zip(PAPER_TYPES, limit))
            lines.append(f"  GPU memory for TF: type memory - CUDA context "
                         f"{self.cuda_context_bytes / MIB:.0f} MiB (CUDA_CONTEXT_BYTES) - TF 1.12 "
                         f"reserve max(300 MiB, 5%): {mem} GiB (x 0.9 usable, cost model)")
        else:
            lines.append("  GPU memory: the type's whole memory (x 0.9 usable, cost model)")
        rule = {True: "tensors TF's gradient functions read (backward_kept_bytes)",
                False: "every layer's output"}
        lines.append(f"  Activation memory: HetPipe plans {rule[self.plan_kept_activations]}"
                     + ("" if self.plan_kept_activations else " (paper Section 7: measured "
                        "per-layer allocations)")
                     + f"; Horovod's fit check {rule[self.horovod_kept_activations]}")
        h = self.horovod
        if h is None:
            lines.append("  Horovod: ring all-reduce after the whole backward pass, no "
                         "fusion; links: PCIe x 0.7 inside, the cross-host bandwidth above")
        elif h == HOROVOD_CPU:
            lines.append(f"  Horovod: all-reduce on the CPU (pip install default), compute "
                         f"then a ring at {h.intra_bandwidth / gb:.3f} GB/s a link inside and "
                         "across hosts (HOROVOD_CPU: Horovod README benchmark, VGG-16 on 16 "
                         "GPUs, 618.0 vs 130.9 images/s on one GPU)")
        else:
            inter = (h.inter_bandwidth or self.inter_bandwidth) / gb
            lines.append(f"  Horovod: NCCL ring, PCIe x 0.7 inside a host, {inter:.2f} GB/s "
                         f"across (IB_FDR_ACHIEVED_BANDWIDTH); fusion "
                         f"{h.fusion_threshold_bytes / MIB:.0f} MiB, cycle "
                         f"{h.cycle_time_s * 1e3:g} ms, overlap with backward: {h.overlap} "
                         "(Horovod <= 0.20 defaults)")
        return lines


PAPER_SETUP = PaperSetup()
# The same with Horovod built with HOROVOD_GPU_ALLREDUCE=NCCL (NCCL over PCIe and InfiniBand,
# fusion and overlap): what the paper's cells would be with NCCL (docs/cluster_model.md).
NCCL_SETUP = dataclasses.replace(PAPER_SETUP, name="TF 1.12 setup, Horovod over NCCL",
                                 horovod=HorovodConfig(
                                     inter_bandwidth=IB_FDR_ACHIEVED_BANDWIDTH))
# The model before the setup facts (what docs/paper_reproduction.md calls "before").
NOMINAL_SETUP = PaperSetup(name="nominal (before)", inter_bandwidth=INFINIBAND_56G_BANDWIDTH,
                           tf_gpu_memory=False, horovod_kept_activations=False, horovod=None,
                           network=None)
# WHAT-IF, NOT the reproduction: link bandwidths fitted to the paper's own Horovod cells
# (VGG-19 4 [V] -> ~1.5 GB/s inside a host, 8 [VR] -> ~1.0 GB/s across hosts).
WHAT_IF_SETUP = dataclasses.replace(NOMINAL_SETUP, name="WHAT-IF fitted to paper's Horovod",
                                    intra_bandwidth=1.5e9 / DEFAULT_INTRA_SCALE,
                                    inter_bandwidth=1e9)


# ------------------------------------------------------------------ profiles


def estimated_profile(model_name: str, cache_dir: str | None = None,
                      batch_size: int = BATCH_SIZE,
                      types: Sequence[str] = PAPER_TYPES) -> ModelProfile:
    """`profile_model(build_model(name), batch_size, types)` with estimated times, cached as
    JSON in `cache_dir` (created if needed) under <model>_b<batch>_<types>.json."""
    path = None
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        path = os.path.join(cache_dir, f"{model_name}_b{batch_size}_{'-'.join(types)}.json")
        if os.path.exists(path):
            with open(path) as f:
                return ModelProfile.from_json(f.read())
    from hetpipe_tf.models import build_model
    from hetpipe_tf.partitioner.profiling import profile_model
    profile = profile_model(build_model(model_name), batch_size, list(types))
    if path:
        tmp = path + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(profile.to_json())
        os.replace(tmp, path)
    return profile


def scale_times(profile: ModelProfile, factor: float) -> ModelProfile:
    """Every layer time on every type multiplied by `factor`."""
    layers = tuple(dataclasses.replace(l, time_s={t: s * factor for t, s in l.time_s.items()})
                   for l in profile.layers)
    return dataclasses.replace(profile, layers=layers)


def calibration_factor(profile: ModelProfile, single_gpu_samples_per_s: float,
                       device_type: str = "TITAN_V") -> float:
    """The factor on layer times that makes one `device_type` alone simulate
    `single_gpu_samples_per_s`. A minibatch on one GPU takes factor x its layer times +
    its plain update (`single_device_samples_per_s`), so the factor is the step's compute
    part over the layer times; the update is not scaled."""
    if single_gpu_samples_per_s <= 0:
        raise ValueError(f"single_gpu_samples_per_s must be > 0. Received: "
                         f"{single_gpu_samples_per_s!r}.")
    if not profile.update_optimizer:
        return single_device_samples_per_s(profile, device_type) / single_gpu_samples_per_s
    step = profile.batch_size / single_gpu_samples_per_s
    update = plain_update_s(profile, device_type)
    if update >= step:
        raise ValueError(f"The update alone is slower than the single-GPU figure. Received: "
                         f"update {update:.4f} s >= step {step:.4f} s on {device_type}; "
                         "check the profile's update_s.")
    layers = profile.batch_size / single_device_samples_per_s(without_update_costs(profile),
                                                              device_type)
    return (step - update) / layers


def calibrate(profile: ModelProfile, single_gpu_samples_per_s: float,
              device_type: str = "TITAN_V") -> tuple[ModelProfile, float]:
    """(calibrated profile, factor): the Table 4 calibration rule (module doc)."""
    f = calibration_factor(profile, single_gpu_samples_per_s, device_type)
    return scale_times(profile, f), f


def kept_activation_bytes(model_name: str, cache_dir: str | None = None) -> list[int]:
    """`backward_kept_bytes` per layer (per sample) of a models.build_model model, cached
    as JSON in `cache_dir` under <model>_kept.json."""
    path = os.path.join(cache_dir, f"{model_name}_kept.json") if cache_dir else None
    if path and os.path.exists(path):
        with open(path) as f:
            return [int(x) for x in json.load(f)]
    from hetpipe_tf.models import build_model
    from hetpipe_tf.partitioner.layer_graph import LayerGraph
    graph = LayerGraph.from_model(build_model(model_name))
    acts = []
    for node in graph.nodes:
        act = getattr(graph.layer_of(node.index), "activation", None)
        acts.append(getattr(act, "__name__", None))
    kept = backward_kept_bytes(graph.nodes, acts)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(kept, f)
        os.replace(tmp, path)
    return kept
