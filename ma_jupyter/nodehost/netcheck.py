"""A machine's network check as the node inspection asks it (contract rule 28 in
``backends/base.py``): the last probe's answer, never waiting for one.

1. :meth:`NetworkCheck.answer` returns at once: the answer of the last probes, None before the
   first one answered;
2. when that answer is :data:`PROBE_EVERY` seconds old, the look starts a new probe on a thread
   of its own, one at a time (making namespaces can take a second on a loaded machine, which
   the supervisor's lock, or a Ray agent's call, must not wait for);
3. a failed probe is said only once :data:`FAULT_AFTER` failed in a row (one may be the
   moment's): until then the last answer stands, and the next look probes again at once;
4. a probe that raises is a failure, its exception the reason.

The one owner of these rules: the local backend's node host checks its machine's job network
with it (``NodeHost.network_fault``), the Ray agents their overlays
(``backends/ray/network_check.py``).

Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: seconds a probe's answer stands for: the node checks of one round, and of the next few,
#: share one probe
PROBE_EVERY = 10.0
#: probes failing in a row before the answer says so (one may be the moment's: a loaded machine)
FAULT_AFTER = 2


class NetworkCheck:
    """The rules of the module docstring around ``probe`` (why the network fails, or None).

    Attributes:
        every: seconds an answer stands for (rule 2).
    """

    def __init__(self, probe: Callable[[], str | None], every: float = PROBE_EVERY):
        self._probe = probe
        self.every = every
        self._lock = threading.Lock()
        self._answered: tuple[float, str | None] = (float("-inf"), None)
        self._running = False
        self._failures = 0

    def answer(self) -> str | None:
        """Rules 1-2: why the last probes failed (None: they passed, or none answered yet)."""
        with self._lock:
            when, why = self._answered
            if time.monotonic() - when >= self.every and not self._running:
                self._running = True
                threading.Thread(target=self._run, name="network-check", daemon=True).start()
            return why

    @property
    def running(self) -> bool:
        """Whether a probe runs now."""
        with self._lock:
            return self._running

    def _run(self) -> None:
        why: str | None = "the network probe did not finish"
        try:
            why = self._probe()
        except Exception as exc:  # rule 4: the probe's own failure is the machine's answer
            why = f"the network probe failed: {exc}"
        finally:  # whatever ended the probe (SystemExit too), the next look may probe again
            with self._lock:
                self._record(why)

    def _record(self, why: str | None) -> None:
        """A probe's answer (under the lock): rules 2 and 3."""
        self._failures = self._failures + 1 if why else 0
        if why and self._failures < FAULT_AFTER:
            self._answered = (float("-inf"), self._answered[1])  # rule 3: probe again next look
        else:
            self._answered = (time.monotonic(), why)
        self._running = False
