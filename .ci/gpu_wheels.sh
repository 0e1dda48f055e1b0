#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that the lent GPU machine lacks (its image has jax, flax, optax,
# orbax, tokenizers, scipy, matplotlib, pyarrow; /work/.library/device/KINDS.md lists them), for Python 3.12 on
# x86-64, at the versions this checkout's venv runs. .ci/gpu_check.sh installs them there. pytest-xdist: pyproject's
# addopts need >= 3.6 (--no-loadscope-reorder), whatever the image holds. Usage: bash .ci/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PKGS="ml_collections==1.1.0 grain==0.2.18 tensorflow-datasets==4.9.10 array_record==0.8.6 dm-tree==0.1.10
  simple-parsing==0.1.9 docstring-parser tensorflow-metadata==1.21.0 googleapis-common-protos termcolor toml
  immutabledict pytest-timeout portpicker tensorboardX pytest-xdist==3.8.0"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d .whl $PKGS
python3 -m pip wheel -q --no-deps -w .whl promise==2.3   # an sdist only: a pure-Python wheel built here
ls .whl
