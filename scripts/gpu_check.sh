#!/usr/bin/env bash
# The GPU checks, for a CUDA host without TensorRT (the workplace's lent H100 / H200):
# pycuda built from its sdist, the unified-memory backend and the zero-copy
# CPU -> GPU -> CPU handover (tests), engine availability as the host reports it, and
# bench/unified_handover.py.
#
#   bash scripts/gpu_check.sh fetch   # here, with network: sdist + wheels into .whl/ (ignored)
#   bash scripts/gpu_check.sh run     # on the GPU host, from the repo root, .whl/ beside it;
#                                     # results and logs under $OUT (default /tmp/gpu_check)
#
# The GPU host runs Python 3.12 with numpy, onnx, onnxruntime (CPU), pytest and the
# service's other dependencies except pydantic, so those wheels travel in .whl/ too.
set -u
cd "$(dirname "$0")/.."
PYCUDA=2026.1
WHEELS="setuptools pytools platformdirs mako siphash24 pydantic pydantic-core annotated-types typing-inspection typing-extensions"

if [ "${1:-}" = fetch ]; then
    set -e
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    grep -qx '/.gpubuild/' .git/info/exclude || echo '/.gpubuild/' >>.git/info/exclude
    url=$(curl -s https://pypi.org/simple/pycuda/ | grep -o "https://[^\"]*pycuda-$PYCUDA.tar.gz" | head -1)
    (cd .whl && curl -sLO "$url")
    for n in $WHEELS; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform any -d .whl "$n"
    done
    ls -la .whl
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 fetch|run" >&2; exit 2; }

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
PY=python3
echo "== host"; nvidia-smi -L; $PY -V; nvcc --version | tail -2; nproc

echo "== wheels"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site

echo "== pycuda $PYCUDA from its sdist"
BUILD=$PWD/.gpubuild   # ignored, not carried: kept on a warm machine between calls
SRC=$BUILD/pycuda-$PYCUDA
if ! ls "$SRC"/pycuda/_driver*.so >/dev/null 2>&1; then
    mkdir -p "$BUILD" /tmp/cudalib
    tar xzf .whl/pycuda-$PYCUDA.tar.gz -C "$BUILD"
    CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    LIBCUDA=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
    [ -n "$LIBCUDA" ] || LIBCUDA=$(find /usr /lib /lib64 /opt -name libcuda.so.1 2>/dev/null | head -1)
    echo "CUDA_ROOT=$CUDA_ROOT libcuda=$LIBCUDA"
    ln -sf "$LIBCUDA" /tmp/cudalib/libcuda.so   # the driver's; the linker wants libcuda.so
    t0=$(date +%s)
    (cd "$SRC" && $PY configure.py --cuda-root="$CUDA_ROOT" --no-cuda-enable-curand \
        --cudadrv-lib-dir="/tmp/cudalib,$CUDA_ROOT/lib64" \
        && $PY setup.py build_ext --inplace -j "$(nproc)") >"$OUT/pycuda_build.log" 2>&1 \
        || { tail -40 "$OUT/pycuda_build.log"; exit 1; }
    echo "built in $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH=/tmp/site:$SRC
$PY -c "import pycuda.driver as c; c.init(); print('pycuda', c.get_version(), c.Device(0).name())" || exit 1

echo "== infscaler (editable, no deps)"
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; exit 1; }

echo "== what the host offers"
$PY - <<'EOF'
from infscaler.engines import engine_availability
from infscaler.engines.tensorrt.cuda import CudaDriver, cuda_devices
from infscaler.shm import unified_memory_available

print("cuda_devices:", cuda_devices())
drv = CudaDriver()
ctx = drv.retain_primary(0)
print("free MB on device 0:", drv.mem_free(ctx) // 2**20)
drv.release_primary(0)
print("unified memory:", unified_memory_available())
for kind, (ok, why) in engine_availability().items():
    print(f"engine {kind}: {'available' if ok else 'unavailable'}: {why}")
EOF

echo "== tests"
$PY -m pytest -q -p no:cacheprovider tests/unit/shm/test_shm_unified.py \
    tests/integration/shm/test_unified_handover.py tests/unit/engines/test_engines.py \
    --junitxml="$OUT/gpu_tests.xml"
echo "pytest rc=$?"

echo "== bench/unified_handover.py"
$PY bench/unified_handover.py --out "$OUT/unified_handover.json"
echo "bench rc=$?"
