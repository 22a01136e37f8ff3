"""HetPipe for TensorFlow 2: pipelined model parallelism over heterogeneous GPUs."""

__version__ = "0.1.0"
