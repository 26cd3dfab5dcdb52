"""jtop stats dicts for the Jetson telemetry tests, transcribed from jetson-stats' own test data.

Key names and units are jetson-stats' (rbonghi/jetson_stats ``jtop/jtop.py``: the
``gpu``, ``power``, ``temperature``, ``memory`` and ``engine`` properties' docstrings;
loads in %, power in mW, clocks and EMC in kHz, memory in KB, °C). The figures are the
tegrastats lines jetson-stats tests its parser with, each field put where jtop puts it;
no figure is ours. The total power follows ``jtop/core/power.py`` ``total_power``: the
``VDD_IN`` / ``POM_5V_IN`` rail when the board has one (taken out of the rails), else the
sum of the rails. nvpmodel is not in tegrastats: ``MAXN`` is the mode name NVIDIA's
power-mode tables use (the references in jtop's ``nvpmodel`` docstring).
"""

from __future__ import annotations

# jetson-stats jtop/tests/test_06_tegra_parse.py, TEGRASTATS_ORIN_JP7: "Real tegrastats
# line from a Jetson AGX Orin Developer Kit running JetPack 7.2 (L4T R39.2)":
#   RAM 20642/62817MB ... EMC_FREQ 3%@3199 GR3D_FREQ 12%@[1300,1300] ... NVDLA0 off
#   NVDLA1 off ... APE 174 cpu@52.968C soc2@48.406C soc0@49.531C gpu@47.625C
#   VDD_GPU_SOC 5139mW VDD_CPU_CV 3268mW VIN_SYS_5V0 5500mW
# (jetson-stats' parser asserts GR3D {'val': 12, 'frq': 1300000} and EMC {'val': 3,
# 'frq': 3199000}: kHz). No VDD_IN rail: jtop's total is the rails' sum, 13907 mW.
ORIN_JP7 = {
    "gpu": {
        "gpu": {
            "type": "integrated",
            "status": {"load": 12.0},
            "freq": {"cur": 1300000, "GPC": [1300000, 1300000]},
        }
    },
    "memory": {
        "RAM": {"tot": 62817 * 1024, "used": 20642 * 1024},
        "EMC": {"online": True, "val": 3, "cur": 3199000},
    },
    "engine": {
        "APE": {"APE": {"online": True, "cur": 174000}},
        "NVDLA": {
            "NVDLA0": {"online": False, "cur": 0},
            "NVDLA1": {"online": False, "cur": 0},
        },
    },
    "temperature": {
        "cpu": {"online": True, "temp": 52.968},
        "soc2": {"online": True, "temp": 48.406},
        "soc0": {"online": True, "temp": 49.531},
        "gpu": {"online": True, "temp": 47.625},
    },
    "power": {
        "rail": {
            "VDD_GPU_SOC": {"online": True, "power": 5139, "avg": 5139},
            "VDD_CPU_CV": {"online": True, "power": 3268, "avg": 3268},
            "VIN_SYS_5V0": {"online": True, "power": 5500, "avg": 5500},
        },
        "tot": {"power": 13907, "avg": 13907},
    },
    "nvpmodel": None,
}

# jetson-stats tests/tegrastats, tegrastats_out_sudo "Orin" (JetPack 5, 01-03-2023):
#   RAM 2257/30536MB ... EMC_FREQ 0%@204 ... CV0@-256C CPU@41.437C Tboard@29C
#   SOC2@39.062C Tdiode@30.75C SOC0@39.031C CV1@-256C GPU@-256C tj@41.656C SOC1@38.937C
#   CV2@-256C VDD_GPU_SOC 2390mW VDD_CPU_CV 796mW VIN_SYS_5V0 3522mW NC 0mW
#   VDDQ_VDD2_1V8AO 301mW NC 0mW
# The GPU load there is $RANDOM: the GPU is left out (jtop reports none here, so
# neither do the gauges). -256 °C is jtop's "offline". jtop skips "NC" rails
# (jtop/core/power.py list_all_i2c_ports); the total is the rails' sum, 7009 mW.
ORIN_JP5 = {
    "memory": {
        "RAM": {"tot": 30536 * 1024, "used": 2257 * 1024},
        "EMC": {"online": True, "val": 0, "cur": 204000},
    },
    "temperature": {
        "CV0": {"online": False, "temp": -256.0},
        "CPU": {"online": True, "temp": 41.437},
        "Tboard": {"online": True, "temp": 29.0},
        "SOC2": {"online": True, "temp": 39.062},
        "Tdiode": {"online": True, "temp": 30.75},
        "SOC0": {"online": True, "temp": 39.031},
        "CV1": {"online": False, "temp": -256.0},
        "GPU": {"online": False, "temp": -256.0},
        "tj": {"online": True, "temp": 41.656},
        "SOC1": {"online": True, "temp": 38.937},
        "CV2": {"online": False, "temp": -256.0},
    },
    "power": {
        "rail": {
            "VDD_GPU_SOC": {"online": True, "power": 2390, "avg": 2390},
            "VDD_CPU_CV": {"online": True, "power": 796, "avg": 796},
            "VIN_SYS_5V0": {"online": True, "power": 3522, "avg": 3522},
            "VDDQ_VDD2_1V8AO": {"online": True, "power": 301, "avg": 301},
        },
        "tot": {"power": 7009, "avg": 7009},
    },
    "nvpmodel": "MAXN",
}

# jetson-stats tests/tegrastats, the "Extra" line (a board with a VDD_IN rail):
#   RAM 4722/7844MB ... EMC_FREQ 2%@1866 GR3D_FREQ $RAND_GPU%@1300 ...
#   VDD_IN 14025/14416 VDD_CPU 2209/2538 VDD_GPU 6854/6903 VDD_SOC 1371/1370
#   VDD_WIFI 19/19 ... VDD_DDR 2702/2702   (instant / average, mW)
# VDD_IN is the total (jtop/core/power.py total_power) and leaves the rails.
WITH_VDD_IN = {
    "memory": {"RAM": {"tot": 7844 * 1024, "used": 4722 * 1024}},
    "power": {
        "rail": {
            "VDD_CPU": {"online": True, "power": 2209, "avg": 2538},
            "VDD_GPU": {"online": True, "power": 6854, "avg": 6903},
            "VDD_SOC": {"online": True, "power": 1371, "avg": 1370},
            "VDD_WIFI": {"online": True, "power": 19, "avg": 19},
            "VDD_DDR": {"online": True, "power": 2702, "avg": 2702},
        },
        "tot": {"name": "VDD_IN", "power": 14025, "avg": 14416},
    },
}
