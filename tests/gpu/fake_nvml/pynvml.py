# ruff: noqa: UP031  (mirrors the real module, which is Python-3.6-era code)
"""FAKE `pynvml` (nvidia-ml-py) for tests: the library boundary only.

No GPU exists on the test machines, so this module stands in for the NVML bindings. It mirrors the
real module's names, argument order, return shapes and NVMLError codes (nvidia-ml-py 13.x), and is
driven by a JSON scenario in $FAKE_NVML_SCENARIO:

  {"init_error": 12 | null, "driver": "550.54.15", "cuda": 12040,
   "devices": [{"name": ..., "values": {"nvmlDeviceGetTemperatureV": 41, ...},
                "errors": {"nvmlDeviceGetRemappedRows": 15, ...}}]}

`values` overrides a function's return value for that device; `errors` makes it raise NVMLError(code)
(13 = FUNCTION_NOT_FOUND models an old driver lacking a newer symbol; 15 = GPU lost; 3 = not supported).
Everything the real node-side gatherer does with the results is real.
"""

import ctypes
import json
import os
from types import SimpleNamespace

NVML_NVLINK_MAX_LINKS = 36
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

_STRINGS = {
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.",
}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _STRINGS.get(self.value, "Unknown Error")


_scenario = json.loads(os.environ.get("FAKE_NVML_SCENARIO", "{}"))
_initialised = False

# Defaults describe a healthy H100: every device gets these unless its scenario overrides them.
_DEFAULTS = {
    "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
    "nvmlDeviceGetPersistenceMode": 1,
    "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetTotalEccErrors": 0,
    "nvmlDeviceGetRemappedRows": [0, 0, 0, 0],
    "recovery_action": 0,
    "nvmlDeviceGetTemperatureV": 35,
    "nvmlDeviceGetTemperature": 35,
    "thresholds": {"0": 92, "1": 89, "2": 95, "3": 87},
    "memory_temp": 40,
    "nvmlDeviceGetVbiosVersion": "96.00.99.00.01",
    "nvmlDeviceGetEnforcedPowerLimit": 700000,
    "nvmlDeviceGetPowerManagementDefaultLimit": 700000,
    # NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS
    "fabric": {"state": 3, "status": 0},
    # None: valid; an NVMLError code (14 = CORRUPTED_INFOROM) to raise
    "inforom_error": None,
    "nvmlDeviceGetCurrentClocksEventReasons": 0x1,
    "nvmlDeviceGetCurrentClocksThrottleReasons": 0x1,
    "nvmlDeviceGetCurrPcieLinkGeneration": 5,
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 16,
    "nvmlDeviceGetMaxPcieLinkWidth": 16,
    "nvmlDeviceGetPcieReplayCounter": 0,
    "utilization": 0,
    "nvmlDeviceGetMigMode": [0, 0],
    "memory_used_mib": 0,
    "memory_total_mib": 81559,
    "processes": [],
    "nvlinks": 18,
    "inactive_links": [],
    "nvlink_errors": {},
}


def _device(handle):
    return _scenario.get("devices", [])[handle]


def _value(handle, name):
    dev = _device(handle)
    code = dev.get("errors", {}).get(name)
    if code is not None:
        raise NVMLError(code)
    values = dev.get("values", {})
    return values[name] if name in values else _DEFAULTS[name]


def _check():
    if not _initialised:
        raise NVMLError(1)


def nvmlInit():
    global _initialised
    code = _scenario.get("init_error")
    if code:
        raise NVMLError(code)
    _initialised = True


def nvmlShutdown():
    global _initialised
    _initialised = False


def nvmlSystemGetDriverVersion():
    _check()
    return _scenario.get("driver", "550.54.15")


def nvmlSystemGetCudaDriverVersion():
    _check()
    return _scenario.get("cuda", 12040)


def nvmlDeviceGetCount():
    _check()
    return len(_scenario.get("devices", []))


def nvmlDeviceGetHandleByIndex(index):
    _check()
    code = _device(index).get("errors", {}).get("nvmlDeviceGetHandleByIndex")
    if code is not None:
        raise NVMLError(code)
    return index


def nvmlDeviceGetName(h):
    return _value(h, "nvmlDeviceGetName")


def nvmlDeviceGetUUID(h):
    return "GPU-00000000-0000-0000-0000-%012d" % h


def nvmlDeviceGetPciInfo_v3(h):
    return SimpleNamespace(busId=("00000000:%02X:00.0" % (0x18 + h * 0x11)).encode())


nvmlDeviceGetPciInfo = nvmlDeviceGetPciInfo_v3


def nvmlDeviceGetPersistenceMode(h):
    return _value(h, "nvmlDeviceGetPersistenceMode")


def nvmlDeviceGetEccMode(h):
    return _value(h, "nvmlDeviceGetEccMode")


def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
    values = _device(h).get("values", {}).get("ecc", {})
    key = "%s_%s" % ("uncorrected" if error_type == 1 else "corrected", "aggregate" if counter_type == 1 else "volatile")
    return values.get(key, _value(h, "nvmlDeviceGetTotalEccErrors"))


def nvmlDeviceGetRemappedRows(h):
    return tuple(_value(h, "nvmlDeviceGetRemappedRows"))


def nvmlDeviceGetRetiredPages(h, cause):
    pages = _device(h).get("values", {}).get("retired_pages", {"0": 0, "1": 0})
    return [0x1000 * i for i in range(pages[str(cause)])]


def nvmlDeviceGetRetiredPagesPendingStatus(h):
    return _device(h).get("values", {}).get("retired_pending", 0)


def nvmlDeviceGetFieldValues(h, field_ids):
    out = []
    for fid in field_ids:
        if fid == 230:
            code = _device(h).get("errors", {}).get("recovery_action")
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=code or 0,
                    value=SimpleNamespace(uiVal=0 if code else _value(h, "recovery_action")),
                )
            )
        elif fid == 82:  # NVML_FI_DEV_MEMORY_TEMP
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=0, value=SimpleNamespace(uiVal=_value(h, "memory_temp"))))
        else:
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED, value=None))
    return out


def nvmlDeviceGetTemperatureV(h, sensor):
    return _value(h, "nvmlDeviceGetTemperatureV")


def nvmlDeviceGetTemperature(h, sensor):
    return _value(h, "nvmlDeviceGetTemperature")


def nvmlDeviceGetTemperatureThreshold(h, which):
    thresholds = _value(h, "thresholds")
    if str(which) not in thresholds:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return thresholds[str(which)]


def nvmlDeviceGetVbiosVersion(h):
    return _value(h, "nvmlDeviceGetVbiosVersion")


def nvmlDeviceGetEnforcedPowerLimit(h):
    return _value(h, "nvmlDeviceGetEnforcedPowerLimit")


def nvmlDeviceGetPowerManagementDefaultLimit(h):
    return _value(h, "nvmlDeviceGetPowerManagementDefaultLimit")


def nvmlDeviceValidateInforom(h):
    code = _value(h, "inforom_error")
    if code:
        raise NVMLError(code)


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    # the fields inferctl reads, in the real struct's order (clusterUuid, status, cliqueId, state, ...)
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]


def nvmlDeviceGetGpuFabricInfoV(h, info_ref):
    # the real binding passes `byref(struct)` to the C library, which fills it in
    fabric = _value(h, "fabric")
    if fabric is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    info = info_ref._obj
    info.state, info.status = fabric["state"], fabric["status"]


def nvmlDeviceGetCurrentClocksEventReasons(h):
    return _value(h, "nvmlDeviceGetCurrentClocksEventReasons")


def nvmlDeviceGetCurrentClocksThrottleReasons(h):
    return _value(h, "nvmlDeviceGetCurrentClocksThrottleReasons")


def nvmlDeviceGetCurrPcieLinkGeneration(h):
    return _value(h, "nvmlDeviceGetCurrPcieLinkGeneration")


def nvmlDeviceGetGpuMaxPcieLinkGeneration(h):
    return _value(h, "nvmlDeviceGetGpuMaxPcieLinkGeneration")


def nvmlDeviceGetMaxPcieLinkGeneration(h):
    return _value(h, "nvmlDeviceGetMaxPcieLinkGeneration")


def nvmlDeviceGetCurrPcieLinkWidth(h):
    return _value(h, "nvmlDeviceGetCurrPcieLinkWidth")


def nvmlDeviceGetMaxPcieLinkWidth(h):
    return _value(h, "nvmlDeviceGetMaxPcieLinkWidth")


def nvmlDeviceGetPcieReplayCounter(h):
    return _value(h, "nvmlDeviceGetPcieReplayCounter")


def nvmlDeviceGetUtilizationRates(h):
    return SimpleNamespace(gpu=_value(h, "utilization"), memory=0)


def nvmlDeviceGetMigMode(h):
    return _value(h, "nvmlDeviceGetMigMode")


def nvmlDeviceGetMemoryInfo(h):
    mib = 1024 * 1024
    used, total = _value(h, "memory_used_mib"), _value(h, "memory_total_mib")
    return SimpleNamespace(used=used * mib, total=total * mib, free=(total - used) * mib)


def nvmlDeviceGetComputeRunningProcesses(h):
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_mib"] * 1024 * 1024)
        for p in _value(h, "processes")
    ]


def nvmlDeviceGetNvLinkState(h, link):
    if link >= _value(h, "nvlinks"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 0 if link in _value(h, "inactive_links") else 1


def nvmlDeviceGetNvLinkErrorCounter(h, link, counter):
    return _value(h, "nvlink_errors").get("%d:%d" % (link, counter), 0)
