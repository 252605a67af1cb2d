#!/usr/bin/env bash
# Builds thetad for NVIDIA GPUs: against the CUDA LibTorch of an installed PyTorch (the python3
# on PATH, or PYTHON=...), or of a LibTorch directory you name (LIBTORCH=/opt/libtorch), with the
# CUDA toolkit and NCCL the system has. Ends with `thetad version`, which must say CUDA and NCCL
# usable.
#
#   bash scripts/build_cuda.sh                      # build-cuda/: thetad and thetad-launch
#   BUILD_DIR=/tmp/b TARGETS=all bash scripts/build_cuda.sh   # everything, tests included
#
# Environment: BUILD_DIR (default build-cuda), TARGETS (default "thetad thetad-launch"),
# CUDAARCHS (the GPUs' compute capability, e.g. 90 for H100; default: the build's own choice),
# JOBS (default: the cores). Needs cmake >= 3.20, a C++17 compiler, MPI, spdlog, yaml-cpp,
# nlohmann-json and zlib (docs/gpu.md lists the packages).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-cuda}
py=${PYTHON:-python3}
if [ -n "${LIBTORCH:-}" ]; then
  prefix=$LIBTORCH
  [ -e "$prefix/share/cmake/Torch/TorchConfig.cmake" ] || {
    echo "build_cuda.sh: LIBTORCH=$prefix has no share/cmake/Torch/TorchConfig.cmake" >&2; exit 2; }
else
  prefix=$("$py" -c 'import torch; assert torch.version.cuda, "a CPU-only PyTorch"; print(torch.utils.cmake_prefix_path)' 2>&1) || {
    echo "build_cuda.sh: no CUDA PyTorch in $py ($prefix); install one, or set LIBTORCH to a CUDA LibTorch" >&2; exit 2; }
fi
read -r -a targets <<< "${TARGETS:-thetad thetad-launch}"
tests=OFF
[ "${targets[*]}" = all ] && tests=ON
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DTHETAD_BUILD_TESTS="$tests"
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"
version=$("$build/daemon/thetad" version)
echo "$version"
if ! grep -q '^backends: .*nccl (GPU tensors)' <<< "$version"; then
  echo "build_cuda.sh: built, but this thetad cannot reduce GPU tensors with NCCL (above)" >&2
  exit 1
fi
echo "build_cuda.sh: built $build/daemon/thetad and $build/launch/thetad-launch"
