#!/usr/bin/env bash
# The GPU checks, for the lent CUDA 13 host without TensorRT (H200; torch 2.11 cu130 with
# nvidia-* libraries in site-packages): onnxruntime-gpu 1.31.1 carried in pieces, the
# gpu engine on its CUDA EP (availability probe, engines, IOBinding, fork safety with the
# zygote) and bench/gpu_iobinding.py; then, time permitting, pycuda from its sdist, the
# unified-memory tests and bench/unified_handover.py. One JSON summary under $OUT.
#
# Here (network):   bash scripts/gpu_check.sh fetch        # .whl/ and .ortgpu/ (ignored)
#                   bash scripts/gpu_check.sh rehearse     # everything up to the first GPU call
# Device calls, back to back (a warm host keeps /tmp for 30 s of idle; N = pieces that
# `fetch` printed; each call carries one piece and the manifest, 64 MiB with the tree):
#   run(command="bash scripts/gpu_check.sh carry 0", carry=[".ortgpu/MANIFEST", ".ortgpu/part.00"], timeout_s=120)
#   ...                                                                   (part.01 .. part.N-1)
#   run(command="bash scripts/gpu_check.sh carry N-1", carry=[".ortgpu/MANIFEST", ".ortgpu/part.<N-1>"], timeout_s=120)
#   run(command="bash scripts/gpu_check.sh run", carry=[".ortgpu/MANIFEST", ".whl"], timeout_s=540)
# then give_back. `run` writes $OUT/gpu_check.json, gpu_check.log, gpu_tests.xml,
# gpu_iobinding.json / .png. Budget: `run` stops starting optional phases after
# GPU_CHECK_BUDGET_S (default 420 s).
set -u
cd "$(dirname "$0")/.."
PYCUDA=2026.1
ORT=onnxruntime-gpu==1.31.1
WHEELS="setuptools pytools platformdirs mako siphash24 pydantic pydantic-core annotated-types typing-inspection typing-extensions"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
STORE=/tmp/ortgpu   # on the device host: the pieces, kept between calls while warm
now() { date +%s.%N; }

tree_bytes() {  # what a device call sends besides carried paths: tracked + untracked-not-ignored
    { git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --apparent-size --files0-from=- 2>/dev/null | tail -1 | cut -f1
}

case "${1:-}" in
fetch)
    set -e
    t0=$(now)
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    mkdir -p "$(dirname "$exclude")" .whl .ortgpu
    for d in /.whl/ /.gpubuild/ /.ortgpu/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
    url=$(curl -s https://pypi.org/simple/pycuda/ | grep -o "https://[^\"]*pycuda-$PYCUDA.tar.gz" | head -1)
    (cd .whl && curl -sLO "$url")
    for n in $WHEELS; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp $PLAT --platform any -d .whl "$n"
    done
    rm -f .ortgpu/*
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $PLAT -d .ortgpu "$ORT"
    wheel=$(ls .ortgpu/*.whl)
    t1=$(now)
    tree=$(tree_bytes); whl=$(du -cb --apparent-size .whl | tail -1 | cut -f1)
    # a piece + the manifest + the tree must fit one call's 64 MiB, with 2 MiB to spare
    piece=$(( (62 << 20) - tree - 4096 )); [ $piece -gt $((56 << 20)) ] && piece=$((56 << 20))
    (cd .ortgpu && split -d -a 2 -b "$piece" "$(basename "$wheel")" part.)
    {
        echo "wheel $(basename "$wheel") $(sha256sum "$wheel" | cut -d' ' -f1) $(stat -c %s "$wheel")"
        for p in .ortgpu/part.*; do echo "piece $(basename "$p") $(sha256sum "$p" | cut -d' ' -f1)"; done
    } >.ortgpu/MANIFEST
    rm -f "$wheel"
    t2=$(now)
    n=$(ls .ortgpu/part.* | wc -l)
    cat .ortgpu/MANIFEST
    echo "tree $((tree >> 20)) MiB, .whl $((whl >> 20)) MiB; piece $((piece >> 20)) MiB: $n pieces" \
        "= $n carry calls, then run (carry .whl: tree + .whl must stay under 64 MiB)"
    printf 'fetch: download %.1f s, split + checksums %.1f s\n' "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
    exit 0
    ;;
carry)
    set -e
    k=$(printf '%02d' "${2:?usage: $0 carry K}")
    mkdir -p "$STORE"
    want=$(awk -v p="part.$k" '$1 == "piece" && $2 == p {print $3}' .ortgpu/MANIFEST)
    got=$(sha256sum ".ortgpu/part.$k" | cut -d' ' -f1)
    [ -n "$want" ] && [ "$want" = "$got" ] || { echo "piece part.$k: sha256 $got, manifest $want" >&2; exit 1; }
    mv ".ortgpu/part.$k" "$STORE/"; cp .ortgpu/MANIFEST "$STORE/"
    echo "carried part.$k; $STORE holds: $(ls "$STORE" | tr '\n' ' ')"
    exit 0
    ;;
run|rehearse) ;;
*) echo "usage: $0 fetch | rehearse | carry K | run" >&2; exit 2 ;;
esac

MODE=$1
OUT=${OUT:-/tmp/gpu_check}
[ "$MODE" = rehearse ] && { OUT=/tmp/gpu_check_rehearsal; STORE=/tmp/ortgpu-rehearsal; }
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 ORT_DISABLE_TELEMETRY=1
PY=${PY:-python3}
T0=$(now)
STEPS="$OUT/steps.tsv"; : >"$STEPS"
step() {  # step NAME CMD...: run, time, record rc
    local s; s=$(now); echo "== $1"; shift
    "$@"; local rc=$?
    printf '%s\t%s\t%.1f\n' "$STEP_NAME" "$rc" "$(echo "$(now) - $s" | bc)" >>"$STEPS"
    return $rc
}
summary() {
    $PY - "$OUT" "$STEPS" "$MODE" <<'PYEOF'
import json, pathlib, sys
out, steps, mode = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [l.split("\t") for l in open(steps).read().splitlines() if l.strip()]
s = {"mode": mode, "steps": [{"step": n, "rc": int(rc), "s": float(t)} for n, rc, t in rows]}
for name in ("probe.json", "gpu_iobinding.json"):
    p = out / name
    if p.exists():
        s[name.removesuffix(".json")] = json.loads(p.read_text())
x = out / "gpu_tests.xml"
if x.exists():
    import xml.etree.ElementTree as ET
    r = ET.parse(x).getroot(); r = r if r.tag == "testsuite" else r.find("testsuite")
    s["tests"] = {k: int(r.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
(out / "gpu_check.json").write_text(json.dumps(s, indent=1))
print(json.dumps(s["steps"]))
PYEOF
}
trap summary EXIT

STEP_NAME=host; step host sh -c 'nvidia-smi -L 2>&1 | head -2; '"$PY"' -V; nproc'

reassemble() {
    if [ "$MODE" = rehearse ]; then rm -rf "$STORE"; mkdir -p "$STORE"; cp .ortgpu/part.* .ortgpu/MANIFEST "$STORE/"; fi
    set -- $(awk '$1 == "wheel" {print $2, $3, $4}' "$STORE/MANIFEST")
    local wheel=$1 sha=$2 n; n=$(awk '$1 == "piece"' "$STORE/MANIFEST" | wc -l)
    [ "$(ls "$STORE"/part.* 2>/dev/null | wc -l)" = "$n" ] || { echo "have $(ls "$STORE" | tr '\n' ' '), want $n pieces: run the carry calls first" >&2; return 1; }
    cat "$STORE"/part.* >"$STORE/$wheel"
    [ "$(sha256sum "$STORE/$wheel" | cut -d' ' -f1)" = "$sha" ] || { echo "$wheel: checksum mismatch" >&2; return 1; }
    echo "$wheel: sha256 ok ($3 bytes)"
    rm -rf /tmp/ortsite
    if [ "$MODE" = rehearse ]; then  # the cp312 wheel into a scratch target, as pip would there
        $PY -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --target /tmp/ortsite "$STORE/$wheel" || return 1
    else
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/ortsite "$STORE/$wheel" || return 1
    fi
    ls /tmp/ortsite/onnxruntime/capi | grep -E 'providers_(cuda|tensorrt)' || return 1
}
STEP_NAME=reassemble; step reassemble reassemble || exit 1

if [ "$MODE" = rehearse ] && ! $PY -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    # this host's Python is not 3.12: import the same release built for it (same files)
    tag=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    rm -rf /tmp/ortsite-local; mkdir -p /tmp/ortdl-local
    STEP_NAME=local_twin; step "the same release for cp$tag (import only)" sh -c \
        "$PY -m pip download -q --no-deps --only-binary=:all: -d /tmp/ortdl-local $ORT && \
         $PY -m pip install -q --no-deps --no-compile --target /tmp/ortsite-local /tmp/ortdl-local/onnxruntime_gpu-*cp$tag*.whl"
    ORTSITE=/tmp/ortsite-local
else
    ORTSITE=/tmp/ortsite
fi

libs() {  # torch's CUDA 13 libraries (nvidia-* wheels): every site-packages/nvidia/*/lib
    local sp; sp=$($PY -c 'import site; print(" ".join(site.getsitepackages()))')
    find $sp -maxdepth 3 -path '*/nvidia/*/lib' -type d 2>/dev/null | sort | paste -sd:
}
NVLIBS=$(libs)
echo "nvidia libraries: ${NVLIBS:-none found}"
export LD_LIBRARY_PATH=${NVLIBS}${NVLIBS:+:}${LD_LIBRARY_PATH:-}
[ "$MODE" = run ] && { $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1; }
export PYTHONPATH=$ORTSITE:/tmp/site:$PWD
export INFSCALER_CACHE_DIR=$OUT/cache

STEP_NAME=import; step "import onnxruntime-gpu" $PY -c \
    'import onnxruntime as o; print(o.__version__, o.__file__); print(o.get_available_providers())' || exit 1
STEP_NAME=probe; step "provider probe (a subprocess; the first CUDA call)" sh -c \
    "$PY -c 'from infscaler.engines.gpu.probe import main; main()' >'$OUT/probe.json' && $PY -c 'import json,sys
from infscaler.engines.gpu.probe import parse_probe
r = parse_probe(open(sys.argv[1]).read(), 0)
print(\"gpu:\", r.gpu_backend()); print(\"dla:\", r.dla_backend())
sys.exit(0 if r.gpu_backend()[0] else 3)' '$OUT/probe.json'"
if [ $? -ne 0 ]; then echo "stopped: no GPU engine on this host (see above)"; exit 0; fi

[ "$MODE" = rehearse ] && { echo "rehearsal: stop before the GPU"; exit 0; }
STEP_NAME=tests; step "GPU tests" $PY -m pytest -q -p no:cacheprovider \
    tests/unit/engines tests/integration/engines/test_gpu_probe_child.py \
    tests/integration/runtime/processes/test_fork_safety.py --junitxml="$OUT/gpu_tests.xml"
STEP_NAME=bench_iobinding; step bench/gpu_iobinding.py $PY bench/gpu_iobinding.py --repeats 30 --out "$OUT/gpu_iobinding.json"

BUDGET=${GPU_CHECK_BUDGET_S:-420}
if [ "$(echo "$(now) - $T0 < $BUDGET - 180" | bc)" = 1 ]; then
    echo "== optional: pycuda $PYCUDA from its sdist, unified memory (time left)"
    BUILD=$PWD/.gpubuild; SRC=$BUILD/pycuda-$PYCUDA
    if ! ls "$SRC"/pycuda/_driver*.so >/dev/null 2>&1; then
        mkdir -p "$BUILD" /tmp/cudalib; tar xzf .whl/pycuda-$PYCUDA.tar.gz -C "$BUILD"
        CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
        LIBCUDA=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
        ln -sf "$LIBCUDA" /tmp/cudalib/libcuda.so
        STEP_NAME=pycuda_build; step pycuda sh -c "cd '$SRC' && $PY configure.py --cuda-root='$CUDA_ROOT' \
            --no-cuda-enable-curand --cudadrv-lib-dir=/tmp/cudalib,$CUDA_ROOT/lib64 && \
            $PY setup.py build_ext --inplace -j $(nproc) >'$OUT/pycuda_build.log' 2>&1"
    fi
    export PYTHONPATH=$PYTHONPATH:$SRC
    STEP_NAME=unified_tests; step "unified-memory tests" $PY -m pytest -q -p no:cacheprovider \
        tests/unit/shm/test_shm_unified.py tests/integration/shm/test_unified_handover.py
else
    echo "== optional phases skipped: budget ${BUDGET} s"
fi
