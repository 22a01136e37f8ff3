"""Installs the `hetpipe_tf` package (HetPipe for TensorFlow 2).

TensorFlow comes in two distributions that install the same `tensorflow` module:
`tensorflow-cpu` (x86-64 Linux and Windows only) and `tensorflow` (CPU+GPU build; the
only one on macOS and aarch64). Installing both lets whichever pip writes last win, so
this file depends on exactly one of them:

* default: `tensorflow-cpu` where it exists, `tensorflow` elsewhere;
* `HETPIPE_TF_GPU=1 pip install -e .`: `tensorflow[and-cuda]` (CUDA wheels from PyPI).
"""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _read(*parts):
    with open(os.path.join(HERE, *parts), encoding="utf-8") as f:
        return f.read()


VERSION = re.search(
    r'^__version__ = "([^"]+)"', _read("hetpipe_tf", "__init__.py"), re.M
).group(1)

TF_RANGE = ">=2.21,<2.22"
# PEP 508 markers have no `not`: the two markers below are each other's complement.
_HAS_TF_CPU = (
    '(platform_machine == "x86_64" or platform_machine == "AMD64") '
    'and sys_platform != "darwin"'
)
_NO_TF_CPU = (
    '(platform_machine != "x86_64" and platform_machine != "AMD64") '
    'or sys_platform == "darwin"'
)

if os.environ.get("HETPIPE_TF_GPU", "").strip().lower() in ("1", "true", "yes"):
    TENSORFLOW = [f"tensorflow[and-cuda]{TF_RANGE}"]
else:
    TENSORFLOW = [
        f"tensorflow-cpu{TF_RANGE}; {_HAS_TF_CPU}",
        f"tensorflow{TF_RANGE}; {_NO_TF_CPU}",
    ]

setup(
    name="hetpipe_tf",
    version=VERSION,  # hetpipe_tf.__version__
    description=(
        "HetPipe for TensorFlow 2: pipelined model parallelism with data parallelism "
        "over heterogeneous GPUs"
    ),
    long_description=_read("README.md"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # Only hetpipe_tf and its subpackages (cluster, partitioner, strategy, ps, sim): never
    # top-level `tests`, `benchmarks`, `strategy` or `ps` packages.
    packages=find_packages(include=["hetpipe_tf", "hetpipe_tf.*"]),
    # keras 3.15 and scipy 1.17 need Python >= 3.11.
    python_requires=">=3.11",
    install_requires=TENSORFLOW
    + [
        "keras>=3.15,<4",
        "tensorflow-datasets>=4.9,<5",
        "numpy>=1.26,<3",
        "scipy>=1.9,<2",  # scipy.optimize.milp
        "absl-py>=1.0,<3",
        "matplotlib>=3.8,<4",  # hetpipe_tf.observe.draw_pipeline_png (PNG timelines)
    ],
    extras_require={
        # The benchmarks' real data set (benchmarks/time_to_accuracy.py: load_digits ships
        # inside scikit-learn, no download).
        "bench": ["scikit-learn>=1.3,<2"],
        "test": [
            "pytest>=8,<10",
            # The README's command runs the suite on 2 processes (-n 2 --dist loadscope:
            # each test module stays whole in one process, as Bazel runs it).
            "pytest-xdist>=3.5,<4",
            "hypothesis>=6.100,<7",
            # keras_hub's GPT2CausalLM as users bring it (tests/strategy/test_tied_weights.py);
            # it pulls tensorflow-text, which pulls the `tensorflow` wheel of the same
            # version beside tensorflow-cpu (the same files).
            "keras-hub>=0.32,<0.33",
            f"tensorflow-text{TF_RANGE}",   # keras-hub's; pinned so it keeps TF at 2.21
            # Keras' TensorBoard callback needs it (tests/strategy/test_switch.py; skipped
            # without it).
            "tensorboard>=2.21,<2.22",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
