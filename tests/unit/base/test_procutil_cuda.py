"""cuda_libraries_mapped (infscaler.base.procutil): the zygote's fork-safety check, on
/proc/PID/maps lines in the kernel's format (proc(5))."""

from __future__ import annotations

from infscaler.base.procutil import cuda_libraries_mapped

MAPS = """\
55d0c0a00000-55d0c0a2d000 r--p 00000000 fd:01 1234   /usr/bin/python3.12
7f1a2c000000-7f1a2c021000 rw-p 00000000 00:00 0
7f1a30000000-7f1a30200000 r-xp 00000000 fd:01 99  /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.03
7f1a31000000-7f1a31100000 r--p 00000000 fd:01 98  /opt/venv/lib/nvidia/cuda_runtime/lib/libcudart.so.13
7f1a31100000-7f1a31200000 r-xp 00100000 fd:01 98  /opt/venv/lib/nvidia/cuda_runtime/lib/libcudart.so.13
7f1a32000000-7f1a32100000 r--p 00000000 fd:01 97  /usr/lib/aarch64-linux-gnu/libnvinfer.so.10 (deleted)
7f1a33000000-7f1a33100000 r--p 00000000 fd:01 96  /usr/lib/libcudnn.so.9
7f1a34000000-7f1a34100000 r--p 00000000 fd:01 95  /site/onnxruntime/capi/libonnxruntime_providers_shared.so
7f1a35000000-7f1a35100000 r--p 00000000 fd:01 94  /usr/lib/libcudacxx_helper.so
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0   [stack]
"""


def test_finds_the_driver_runtime_and_tensorrt_once_each():
    assert cuda_libraries_mapped(MAPS) == [
        "/opt/venv/lib/nvidia/cuda_runtime/lib/libcudart.so.13",
        "/usr/lib/aarch64-linux-gnu/libnvinfer.so.10 (deleted)",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.03",
    ]


def test_cpu_only_maps_have_none():
    cpu = "\n".join(ln for ln in MAPS.splitlines() if "libcud" not in ln and "nvinfer" not in ln)
    assert cuda_libraries_mapped(cpu) == []
    assert cuda_libraries_mapped("") == []


def test_this_process_has_none():  # the unit tests never touch CUDA
    assert cuda_libraries_mapped() == []
