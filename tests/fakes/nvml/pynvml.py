"""A fake ``pynvml`` (nvidia-ml-py) reading its cards from ``$MA_FAKE_GPUS`` (see tests/fakes)."""

import json
import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def _state():
    path = os.environ.get("MA_FAKE_GPUS")
    if not path:
        raise NVMLError("NVML Shared Library Not Found")
    with open(path) as fh:
        return json.load(fh)


def nvmlInit():
    _state()


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return _state()["driver"]


def nvmlDeviceGetCount():
    return int(_state()["count"])


def nvmlDeviceGetHandleByIndex(index):
    state = _state()
    if index >= state["count"]:
        raise NVMLError("Invalid Argument")
    if index in state.get("failed", []):
        raise NVMLError("GPU is lost")
    return index


def nvmlDeviceGetMinorNumber(handle):
    """The N of /dev/nvidia<N>: the state's ``minors`` (index -> minor), else the index."""
    return int(_state().get("minors", {}).get(str(handle), handle))


def nvmlDeviceGetName(handle):
    return _state()["model"]


def nvmlDeviceGetMemoryInfo(handle):
    state = _state()
    total = state["memory_mb"] << 20
    used = int(state.get("used_mb", 0)) << 20
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=int(_state().get("util", 0)), memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle):
    """The processes "using" the card: those whose command line names the state's
    ``process_match``, each holding ``process_mb`` MiB."""
    state = _state()
    match, held = state.get("process_match"), int(state.get("process_mb", 0)) << 20
    found = []
    if match:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if match.encode() in fh.read():
                        found.append(SimpleNamespace(pid=int(name), usedGpuMemory=held))
            except OSError:
                continue
    return found
