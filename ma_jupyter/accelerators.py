"""Accelerator cards of this machine: one table naming each card type's device nodes and how its
cards are detected, read, and checked while jobs run.

:data:`TYPES` is the only place that knows a card type's device nodes.  For each type:

* **card nodes**: one per card (``/dev/nvidia<N>``, ``/dev/davinci<N>``), ``N`` the card's
  device minor number; a card is otherwise known by its index on the machine, the one
  ``nvidia-smi`` / ``npu-smi`` show, which the scheduler hands out (``TaskSlot.devices``) and the
  cluster view lists.  The two are the same on most machines; where NVML says otherwise
  (``nvmlDeviceGetMinorNumber``), :func:`card_node` maps one to the other;
* **shared nodes**: the driver's control nodes every process using a card needs
  (``nvidiactl``, ``nvidia-uvm``...), bound into every node that has a card of that type;
* **detection**: NVIDIA through NVML (the ``pynvml`` module of ``nvidia-ml-py``) when it is
  importable and answers, else ``nvidia-smi --query-gpu=...``; Ascend through ``npu-smi info``.

Rules:

1. :func:`detect` never raises: a machine without the tools, a tool that fails or hangs (10 s)
   or prints what cannot be parsed has no cards of that type.  Its answer is kept for the life
   of the process (:func:`forget` drops it).
2. Cards are *real* on a node when the machine shows the type's card nodes
   (:func:`has_device_nodes`), else emulated (indices only, nothing bound into a sandbox).
3. A node's sandbox gets exactly the card nodes of its own cards plus the type's shared nodes
   that exist (:func:`device_paths`), each bound with ``--dev-bind`` (``nodehost/bwrap.py``, the one builder of bubblewrap argv).
4. Inside a bubblewrap sandbox the process sees only its own cards, so CUDA and the Ascend
   runtime number them from 0 in index order: :func:`visible_indices` renumbers, and
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` keeps CUDA's order the index order (CUDA's default puts the
   fastest card first).  Without a sandbox every card is visible and the machine's indices are
   kept.
5. :func:`card_fault` says why a real card can no longer be used (its node is gone, NVML
   reports it lost; "disappeared" only for a card the machine showed, by detection or an
   earlier check, never for one that cluster.toml declares beyond the machine's cards); :func:`sample` reads utilization and memory of given cards (NVML only,
   None when it cannot tell).

Nothing here imports the rest of the package: the configuration, the backends and
the service all read cards through it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: the folder holding device nodes (a test's private mount namespace puts fake ones there)
DEV = "/dev"
#: the longest a detection tool may run before the machine is taken to have no cards of its type
TOOL_TIMEOUT = 10.0
#: ``MA_JUPYTER_CARDS=none``: take this machine as one without cards (no detection, every card
#: of cluster.toml emulated unless it says otherwise): the default cluster then has emulated cards
ENV_CARDS = "MA_JUPYTER_CARDS"


@dataclass(frozen=True)
class Card:
    """One card of the machine, as its vendor's tool reports it.

    Attributes:
        type: the spec's ``accelerator_type`` (``gpu``, ``npu``).
        index: the machine's index (``nvidia-smi``'s, the N of ``/dev/nvidia<N>``).
        model: the board model (``NVIDIA H100 80GB HBM3``).
        memory_mb: the card's memory in MiB (0: unknown).
        driver_version: the driver's version (``580.159.04``; "" unknown).
        minor: the N of its device node when NVML says it differs from ``index`` (None: the
            same).
    """

    type: str
    index: int
    model: str
    memory_mb: int = 0
    driver_version: str = ""
    minor: int | None = None


@dataclass(frozen=True)
class CardUse:
    """One node's cards at one moment: utilization (mean over its cards, 0..100) and the memory
    in use on them (MiB); either None when the driver cannot tell."""

    percent: float | None
    memory_mb: float | None


@dataclass(frozen=True)
class CardType:
    """One accelerator type: its device nodes and its detection.

    Attributes:
        name: the spec's ``accelerator_type``.
        vendor: who makes it (for messages).
        card_node: the card node's name with ``{}`` for the index (``nvidia{}``).
        shared_nodes: the control nodes every user of a card needs, bound where they exist
            (a folder, such as ``nvidia-caps``, is bound whole).
        detect: the machine's cards of this type (rule 1: never raises).
        tool: the command whose presence says the driver is installed (for messages).
    """

    name: str
    vendor: str
    card_node: str
    shared_nodes: tuple[str, ...]
    detect: Callable[[], list[Card]]
    tool: str

    def card_path(self, index: int) -> str:
        return os.path.join(DEV, self.card_node.format(index))

    def card_pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.escape(self.card_node).replace(r"\{\}", "{}").format(r"(\d+)") + "$")


# ----------------------------------------------------------------------------- NVIDIA

NVIDIA_QUERY = "--query-gpu=index,name,memory.total,driver_version"


#: seconds before NVML is tried again after it could not be loaded or initialised
NVML_RETRY = 60.0
_nvml_lock = threading.Lock()
#: the card nodes :func:`card_fault` found present: such a card, once gone, disappeared
_seen_nodes: set[str] = set()
_nvml_module: list = []  # the initialised pynvml module, once it is
_nvml_failed: list[float] = []  # when it last failed (monotonic)


def _nvml():
    """The ``pynvml`` module, initialised once for the process (``nvmlInit`` can take a good part
    of a second: the node inspection and the resource sampler ask every second or two); None when
    it is missing or NVML does not answer (tried again after :data:`NVML_RETRY` seconds)."""
    with _nvml_lock:
        if _nvml_module:
            return _nvml_module[0]
        if _nvml_failed and time.monotonic() - _nvml_failed[0] < NVML_RETRY:
            return None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
        except Exception:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...: no NVML here
            _nvml_failed[:] = [time.monotonic()]
            return None
        _nvml_module[:] = [pynvml]
        return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvidia_by_nvml() -> list[Card] | None:
    """The cards NVML lists; None when NVML cannot be used (then ``nvidia-smi`` is asked)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cards = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
            try:
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            except Exception:  # not supported on this platform: the index names the node
                minor = index
            name = _text(nvml.nvmlDeviceGetName(handle))
            cards.append(
                Card("gpu", index, name, int(memory >> 20), driver, None if minor == index else minor)
            )
        return cards
    except Exception:
        return None


def _run_tool(argv: list[str]) -> str | None:
    """A detection tool's output; None when it is missing, fails or hangs."""
    import shutil  # here, not at the top: a command-line call reads the config and never probes
    import subprocess

    program = shutil.which(argv[0])
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, *argv[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(output: str) -> list[Card]:
    """Cards from ``nvidia-smi --query-gpu=index,name,memory.total,driver_version
    --format=csv,noheader,nounits`` (one card a line; lines that do not parse are skipped)."""
    cards = []
    for line in output.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        index, name, memory, driver = fields
        try:
            cards.append(Card("gpu", int(index), name, int(float(memory)), driver))
        except ValueError:
            continue
    return sorted(cards, key=lambda c: c.index)


def detect_nvidia() -> list[Card]:
    """NVIDIA cards: NVML when importable and answering, else ``nvidia-smi``; [] without either."""
    cards = _nvidia_by_nvml()
    if cards is not None:
        return cards
    output = _run_tool(["nvidia-smi", NVIDIA_QUERY, "--format=csv,noheader,nounits"])
    return parse_nvidia_smi(output) if output else []


# ----------------------------------------------------------------------------- Ascend


def parse_npu_smi(listing: str, header: str = "") -> list[Card]:
    """Cards from ``npu-smi info -l`` (``NPU ID : N`` then ``Product Name : ...`` per card),
    the driver version from the ``Version:`` of ``npu-smi info``'s header."""
    version = re.search(r"Version:\s*(\S+)", header)
    driver = version.group(1) if version else ""
    cards: list[Card] = []
    index: int | None = None
    for line in listing.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "NPU ID":
            if index is not None:
                cards.append(Card("npu", index, "Ascend", 0, driver))
            try:
                index = int(value)
            except ValueError:
                index = None
        elif key == "Product Name" and index is not None:
            cards.append(Card("npu", index, value or "Ascend", 0, driver))
            index = None
    if index is not None:
        cards.append(Card("npu", index, "Ascend", 0, driver))
    return sorted(cards, key=lambda c: c.index)


def detect_ascend() -> list[Card]:
    """Ascend cards from ``npu-smi``; [] without it."""
    listing = _run_tool(["npu-smi", "info", "-l"])
    if not listing:
        return []
    return parse_npu_smi(listing, _run_tool(["npu-smi", "info"]) or "")


# ------------------------------------------------------------------------------ table

TYPES: dict[str, CardType] = {
    "gpu": CardType(
        name="gpu",
        vendor="NVIDIA",
        card_node="nvidia{}",
        shared_nodes=("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps"),
        detect=detect_nvidia,
        tool="nvidia-smi",
    ),
    "npu": CardType(
        name="npu",
        vendor="Huawei Ascend",
        card_node="davinci{}",
        shared_nodes=("davinci_manager", "devmm_svm", "hisi_hdc"),
        detect=detect_ascend,
        tool="npu-smi",
    ),
}

_detected: dict[str, list[Card]] = {}
_lock = threading.Lock()


def detect(kind: str) -> list[Card]:
    """This machine's cards of type ``kind`` (rule 1); [] for a type the table does not know, or
    with ``MA_JUPYTER_CARDS=none``."""
    card_type = TYPES.get(kind)
    if card_type is None or cards_turned_off():
        return []
    with _lock:
        if kind not in _detected:
            try:
                _detected[kind] = card_type.detect()
            except Exception:  # rule 1: a detection never takes the service down
                _detected[kind] = []
        return list(_detected[kind])


def detect_all() -> dict[str, list[Card]]:
    """Every type's cards on this machine (types without cards left out)."""
    found = {kind: detect(kind) for kind in TYPES}
    return {kind: cards for kind, cards in found.items() if cards}


def forget() -> None:
    """Drop what :func:`detect` remembers, and NVML's state (cards added or removed; tests)."""
    with _lock:
        _detected.clear()
        _seen_nodes.clear()
    with _nvml_lock:
        _nvml_module.clear()
        _nvml_failed.clear()


# ------------------------------------------------------------------------ device nodes


def card_indices_present(kind: str) -> list[int]:
    """The indices of the card nodes of ``kind`` this machine shows (``/dev/nvidia0``...)."""
    card_type = TYPES.get(kind)
    if card_type is None:
        return []
    pattern = card_type.card_pattern()
    try:
        names = os.listdir(DEV)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def has_device_nodes(kind: str) -> bool:
    """Rule 2: whether this machine shows card nodes of ``kind`` (never with
    ``MA_JUPYTER_CARDS=none``: the machine is then taken to have no cards at all)."""
    return not cards_turned_off() and bool(card_indices_present(kind))


def cards_turned_off() -> bool:
    """Whether ``MA_JUPYTER_CARDS=none`` says to take this machine as one without cards."""
    return os.environ.get(ENV_CARDS, "").lower() == "none"


def card_node(kind: str, index: int) -> str:
    """The device node of card ``index`` (the machine's index) of ``kind``: ``/dev/nvidia<minor>``
    with the minor number NVML reported for it, else the index itself."""
    card_type = TYPES[kind]
    minor = next((c.minor for c in detect(kind) if c.index == index and c.minor is not None), index)
    return card_type.card_path(minor)


def device_paths(kind: str, indices: list[int] | tuple[int, ...]) -> list[str]:
    """Rule 3: the device nodes a node holding cards ``indices`` of ``kind`` needs and this
    machine has: each card's node, then the shared nodes that exist; [] for an unknown type
    or no card.  A card whose node is missing is left out (the launch refuses, see
    :func:`missing_cards`)."""
    card_type = TYPES.get(kind)
    if card_type is None or not indices:
        return []
    paths = [p for p in (card_node(kind, i) for i in indices) if os.path.exists(p)]
    if not paths:
        return []
    paths += [p for p in (os.path.join(DEV, n) for n in card_type.shared_nodes) if os.path.exists(p)]
    return paths


def missing_cards(kind: str, indices: list[int] | tuple[int, ...]) -> list[int]:
    """The cards among ``indices`` whose node this machine no longer shows."""
    card_type = TYPES.get(kind)
    if card_type is None:
        return []
    return [i for i in indices if not os.path.exists(card_node(kind, i))]


def visible_indices(indices: list[int] | tuple[int, ...], sandboxed: bool) -> list[int]:
    """Rule 4: the card numbers the node's processes use (``CUDA_VISIBLE_DEVICES``): 0..k-1 in
    a sandbox showing only the node's k cards, the machine's indices otherwise."""
    return list(range(len(indices))) if sandboxed else list(indices)


# ------------------------------------------------------------------------- while jobs run


def card_fault(kind: str, index: int) -> str | None:
    """Rule 5: why card ``index`` of ``kind`` can no longer be used, or None while it looks
    healthy: its device node is gone, or NVML fails to read it (a card that fell off the bus)."""
    card_type = TYPES.get(kind)
    if card_type is None:
        return None
    path = card_node(kind, index)
    if not os.path.exists(path):
        # only a card this machine showed can have disappeared: one that cluster.toml declares
        # beyond the machine's cards never existed here, and saying it vanished misleads
        with _lock:
            seen = path in _seen_nodes
        if seen or any(c.index == index for c in detect(kind)):
            return f"{card_type.vendor} card {index} disappeared: {path} is gone"
        return (
            f"{card_type.vendor} card {index} is not on this machine: there is no {path} "
            "(its [[node]] of cluster.toml lists more cards than the machine has; give it "
            "card_indices of cards the machine shows, or emulated = true)"
        )
    with _lock:
        _seen_nodes.add(path)
    if kind != "gpu":
        return None
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        nvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:
        return f"{card_type.vendor} card {index} fails: NVML says {_text(exc) or type(exc).__name__}"
    return None


def sample(kind: str, indices: list[int] | tuple[int, ...], pids: set[int] | None = None) -> CardUse | None:
    """Rule 5: the utilization (mean of the cards) and the card memory in use on cards
    ``indices`` of ``kind``, through NVML: with ``pids``, the memory held by those processes
    only (a node's own, where the driver lists them), else all of the cards' used memory; None
    when it cannot tell (no NVML, another type, no card)."""
    if kind != "gpu" or not indices:
        return None
    nvml = _nvml()
    if nvml is None:
        return None
    percents, memory = [], 0.0
    for index in indices:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            percents.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            if pids is None:
                memory += nvml.nvmlDeviceGetMemoryInfo(handle).used / (1 << 20)
            else:
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid in pids and process.usedGpuMemory:  # None: not allowed to read
                        memory += process.usedGpuMemory / (1 << 20)
        except Exception:
            return None
    return CardUse(round(sum(percents) / len(percents), 1), round(memory, 1))


def card_type_of(paths: list[str] | tuple[str, ...]) -> str:
    """The card type whose card nodes are among device node ``paths`` ("" when none is)."""
    for kind, card_type in TYPES.items():
        pattern = card_type.card_pattern()
        if any(pattern.match(os.path.basename(p)) for p in paths):
            return kind
    return ""
