"""The per-node runner: ``python -m ma_jupyter.nodehost.noderun <node-run.json>``, the file of its
instructions (:class:`.instructions.RunnerInstructions`, read as attributes; a file it cannot read,
or of another version, runs nothing: the runner says why in the node's log and exits 2).

The local backend starts one runner per node, in its own session, with stdout/stderr already
pointing at the node's log file; the service is never in the log path.  The runner:

1. pins itself to the task's cores (inherited by everything it starts), and watches the
   node's limits (:mod:`.watchdog`): every ``MEMORY_SAMPLE`` seconds it walks every process
   below it and

   a. memory: where the backend found a writable memory cgroup (``cgroup``), the runner makes the
      node's own (:mod:`.cgroup`) before any phase, limited to ``memory_gb`` (and its tasks to
      ``max_processes``), and every phase's first process moves itself in before it executes
      (the runner stays outside: a job's OOM never kills it); a process the kernel kills there
      for memory ends the node: the watchdog kills the rest and reports "exceeded its memory
      limit of N GB on <node>" as the node's failure; the cgroup is removed when the node ends.
      Without one (or where the runner cannot make it: it says so in the node's log), the
      watchdog's sum bounds it: past ``memory_gb`` (resident memory plus what the node's
      sandboxes hold in ``/tmp``, ``/dev/shm`` and ``/run``) it kills them all, same report;
   b. processes: the node's tasks (processes and threads) are bounded by the kernel at
      ``max_processes`` (``[limits] max_node_processes``): as root, in bubblewrap (where the
      backend found it works, ``own_user_namespace``), the runner makes the node a user
      namespace of its own and starts each phase in it with that ``RLIMIT_NPROC``
      (:mod:`.userns`).  Reaching it, a fork fails with ``EAGAIN`` in the job and the node's log
      says so once.  Where no such namespace can be made (not root, the symlink mode), or the
      node runs as root (an admin's ``allow_root``), the watchdog kills the node past it instead
      (the ``pids`` limit of the node's cgroup, where it has one, is the kernel's backstop);
   c. logs: past ``max_log_bytes`` (``[limits] max_log_mb``, all the job's logs on this machine)
      it kills the node and reports "logs exceeded ... max_log_mb" (the node log is written by
      the job's processes directly, so the cap ends the writer rather than cutting what it
      writes); so does a logs folder of too many entries, or logs flooding a nearly full disk
      ("disk nearly full under <logs>");
2. at the node's first launch, has its working copy filled from the algorithm folder (see
   :mod:`ma_jupyter.nodeside.workdir`): by the first phase itself in bubblewrap (as the job's
   account, before the command; it reports the end on a pipe), by the runner in the symlink
   mode; and records it complete in ``nodes/<node>/workdir.json``, so later attempts continue
   in it; a copy that fails ends the node with its code (3 over the size limit);
3. runs the optional lifecycle ``on_start`` command, then the node's command, then ``on_stop``,
   each already wrapped in the node's sandbox by the backend, then (``export``, when anything in
   the working copy changed since the copy) keeps what the job wrote there in its outputs; with
   a debug terminal the command runs under the shell agent (:mod:`.shell_agent`), which reports
   its exit code on a pipe and, for a failed command, keeps the command's sandbox for the
   terminal until the runner releases it (at the end of ``keep_failed_seconds``, or a stop);
4. forwards SIGTERM/SIGINT to every process of the node (not to bubblewrap itself, which would
   kill the node at once) so training code gets its chance to save a checkpoint, once it has
   claimed the stop's relay (:mod:`.stopping`: a backend that saw no claim in time delivered the
   signal itself, and the runner then sends nothing more).  A signal that comes while a phase
   starts (before its sandbox has started the phase's processes) is delivered to them as soon as
   they exist, within :data:`LATE_RELAY_LIMIT` seconds (then bubblewrap itself is TERMed), and a
   stop that comes before the command phase starts skips it: a stop right after the start never
   waits out the grace period;
5. when a phase ends, kills what it left behind (a bubblewrap pid namespace does this by
   itself; in the symlink mode the runner is a child subreaper and finds them as descendants);
6. moves ``$MA_RANK_LOG_DIR/failure.json`` (a launcher's report of the first failed rank) to
   ``nodes/<node>/failure.json``, and ``not-distributed.json`` (torch's launcher on node 0: no
   rank joined a process group) to ``nodes/<node>/``, each when it is a small regular file (see
   :func:`ma_jupyter.untrusted.collect_report`) and writes the exit code atomically to
   ``nodes/<node>/exit_code``, so a service that was down meanwhile learns the result.  A disk
   the job fills never keeps that end from being recorded: the two records' disk is reserved
   when the node starts (:func:`.end_records.reserve_room`), a kill the watchdog began finishes first (the
   log cap's cut of the overflow, within :data:`WATCHDOG_SETTLE` seconds), and writes past the
   reserved room wait for room, all together, ``END_WRITE_WAIT`` seconds
   (:mod:`.end_records`); the heartbeat (7) goes on until the exit code is written;
7. beats: every ``HEARTBEAT_EVERY`` seconds, while it runs, it sets the time of
   ``nodes/<node>/heartbeat`` to now (one ``utime``), so the service's node inspection sees a
   runner that stopped (frozen, or its machine gone) by the file's age;
8. ends with its host: where its instructions name the process hosting the node (``end_with``: a Ray
   node's raylet, see :mod:`.hostwatch`), the end of that process ends the node as a stop
   would, but within ``hostwatch.HOST_GRACE`` seconds: TERM to its processes, then KILL to every process
   below the runner until it ends (``on_stop`` included); what was ended is said in the log and
   written as the node's failure report at once (before the TERM: the backend may read it as soon
   as it sees the host gone) and again at the end;
9. holds the user's cache lease (``cache_lease``, :func:`hold_cache_lease`) from before its
   first phase until it ends, so a launch of the user's next job knows whether a lock in the
   cache may still have a holder (:mod:`.caches` rule 6).

Exit codes follow the shell: a command killed by signal N ends with 128+N.

Why one module (over 600 lines): it is one program, the node runner, whose numbered steps above
run in that order in one process (network, limits, working copy, phases, export, status); its
parts with a life of their own are already rooms (:mod:`.watchdog`, :mod:`.cgroup`,
:mod:`.userns`, :mod:`.stopping`, :mod:`.instructions`, :mod:`.fence`, :mod:`.end_records`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..jobdir import FAILURE_REPORT, NOT_DISTRIBUTED_REPORT, NodeDir
from ..nodeside import workdir
from ..nodeside.exec_env import COPY_FD, ENV_FD, env_file_data
from ..untrusted import collect_report
from . import hostwatch, stopping, watchdog
from .agent_wire import RELEASE_FD, STATUS_FD
from .cgroup import NodeCgroup
from .end_records import END_WRITE_WAIT, reserve_room, write_end, write_exit_code, write_report
from .instructions import RunnerInstructions
from .procfs import descendants, process_start_time, process_tree
from .userns import (
    CHECK_USER_NAMESPACE,
    PR_SET_CHILD_SUBREAPER,
    check_user_namespace,
    enter_node,
    node_user_namespace,
    prctl,
)

#: seconds between two heartbeats (rule 7); the service's faulty threshold is several of them
HEARTBEAT_EVERY = 1.0


#: how long a runner tries to take its cache's lease while a launch beside it releases stale locks
LEASE_WAIT = 10.0


def hold_cache_lease(path: str) -> int | None:
    """Take the user's cache lease ``path`` shared for as long as this runner lives (rule 9,
    :mod:`.caches` rule 6); the descriptor (close-on-exec: the node's own processes do not
    inherit it), or None when it cannot be opened or taken within :data:`LEASE_WAIT` seconds."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    deadline = time.monotonic() + LEASE_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:  # a launch beside this one is releasing stale locks: a moment
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def _say(text: str) -> None:
    """A line of the platform's in the node's log (never fatal: the disk may be full)."""
    try:
        print(f"[ma_jupyter] {text}", file=sys.stderr, flush=True)
    except OSError:
        pass


#: seconds a signal that came while a phase started waits for the phase's processes (rule 4);
#: bubblewrap starts them in well under a second, even on a loaded machine
LATE_RELAY_LIMIT = 30.0


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # ended meanwhile (its pid not reused yet)
        pass


def reap_ended() -> None:
    """Collect every child process that has ended, without waiting for the others."""
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0:
            return


#: seconds the runner waits, at the node's end, for the watchdog to finish a kill it began (its
#: processes gone, then, for the log cap, the logs' overflow cut: room given back on their disk)
WATCHDOG_SETTLE = 10.0


class NodeRunner:
    """Runs the phases of one node and relays signals to them."""

    def __init__(self, instructions: RunnerInstructions):
        self.instructions = instructions
        self.stopping = False
        self.current: subprocess.Popen | None = None
        # from the start of a phase's preparation until its process is ``current`` (rule 4)
        self.starting = False
        # a failed command's phase kept for the debug terminal (its shell agent), and the
        # descriptor whose close ends it
        self.agent: subprocess.Popen | None = None
        self.release: int | None = None
        self.exceeded: str | None = None  # the failure sentence, once the watchdog acted
        self.host_gone: str | None = None  # the failure sentence, once the host process ended
        self._ended = threading.Event()
        self._watchdog: threading.Thread | None = None  # rule 1, while it runs
        # set once the node's end is recorded (its exit code written, or given up): the heartbeat
        # goes on until then, also while the end's writes wait for room
        self._recorded = threading.Event()
        # rule 1b: the node's own user namespace (a descriptor), where one could be made
        self.userns: int | None = None
        self.max_processes = instructions.max_processes
        # rule 1a: the node's own cgroup, where the backend found one can be made (made in run())
        self.cgroup: NodeCgroup | None = NodeCgroup(instructions.cgroup) if instructions.cgroup else None

    def _preexec(self) -> Callable[[], None]:
        enter = enter_node(self.userns, self.max_processes)
        node_cgroup = self.cgroup
        if node_cgroup is None:
            return enter

        def preexec() -> None:
            node_cgroup.enter()  # first: in the node's user namespace the cgroup is not writable
            enter()

        return preexec

    def _make_cgroup(self, *, first: bool) -> None:
        """Rule 1a: make the node's cgroup with its limits before the first phase; where it cannot,
        say so and leave the node's memory to the watchdog.  Before each later phase, make it
        again (a sweep may have removed it while empty); failing then, the phase's child cannot
        enter it and exits 126: the bound chosen for the node never silently changes."""
        if self.cgroup is None:
            return
        try:
            memory = int((self.instructions.memory_gb or 0) * (1 << 30))
            self.cgroup.create(memory, self.max_processes)
        except OSError as exc:
            if first:
                _say(f"no cgroup of its own for this node ({exc}): its memory limit is the watchdog's")
                self.cgroup.remove(wait=0)
                self.cgroup = None

    def _check_oom(self) -> None:
        """Rule 1a: a phase ended: a process the kernel killed for memory is the node's failure
        (the watchdog may not have sampled since)."""
        if self.cgroup is None or self.exceeded is not None or not self.instructions.memory_gb:
            return
        kills = self.cgroup.oom_kills()
        if kills:
            limits = watchdog.Limits(self.instructions, kernel_bound=True)
            self.exceeded = watchdog.memory_reason(limits, kills, self.cgroup.peak_bytes())
            _say(self.exceeded)
            self.stopping = True

    def _kernel_bound(self) -> bool:
        """Whether the kernel bounds the node's processes (rule 1b): in its own user namespace,
        as an account other than root (``RLIMIT_NPROC`` never applies to root).  A ``pids``
        limit of the node's cgroup (rule 1a) is the kernel's backstop, root's nodes included, but
        the watchdog still ends those past the limit: the sentence says what happened."""
        return self.userns is not None and self.instructions.account_uid != 0

    def _watch(self) -> None:
        """The watchdog (rule 1, :mod:`.watchdog`): past a limit, the first reason is the node's,
        said in its log, no further phase but ``on_stop`` starts, and every process of the node
        is killed (the phase then ends with 128+9)."""

        def exceeded(reason: str) -> None:
            if self.exceeded is None:
                self.exceeded = reason
                _say(reason)
            self.stopping = True  # no further phase but on_stop

        limits = watchdog.Limits(self.instructions, kernel_bound=self._kernel_bound())
        watchdog.watch(limits, self._ended, _say, exceeded, memory_cgroup=self.cgroup)

    def _beat(self, path: Path) -> None:
        """Rule 7: refresh the heartbeat file's time until the node ends."""
        while not self._recorded.is_set():
            try:
                path.touch()  # an existing file: its time only
            except OSError:
                if not path.parent.is_dir():
                    return  # the node's folder is gone (the job was deleted): nothing to say
                # else transient (a full disk, an interrupted call): beat again next time
            self._recorded.wait(HEARTBEAT_EVERY)

    def _end_with_host(self, what: str) -> None:
        """Rule 8: ``what`` (the process hosting the node) ended: end every process of the node
        (:func:`.hostwatch.end_node`)."""

        def gone(sentence: str) -> None:
            self.host_gone = sentence
            self.stopping = True  # no further phase
            # written now, not only at the end: the service may learn of the host's end before
            # this node has ended, and reads the report once (rewritten at the end, step 6)
            failure = NodeDir(Path(self.instructions.node_dir)).failure
            try:
                write_report(failure, {"reason": sentence})
            except OSError:  # a full disk: the end's write tries again
                pass
            reserve_room(failure)  # the end's write of it again (its first room was used)

        def terminate() -> None:
            # the stop's one SIGTERM, as rule 4: a backend stopping the node meanwhile sends none
            if stopping.claim(NodeDir(Path(self.instructions.node_dir)).stop_claim, stopping.RUNNER):
                self._signal_all(signal.SIGTERM)

        hostwatch.end_node(self.instructions.node, what, self._ended, gone, terminate)

    # the processes of the node a stop signal is meant for (never bubblewrap itself)
    def _targets(self) -> list[int]:
        if self.current is None and not self.starting:
            return []
        return stopping.targets(os.getpid(), self.instructions.sandbox)

    def _signal_all(self, signum: int) -> None:
        """Rule 4: ``signum`` to the node's processes; where a phase is starting and has none
        yet, to them once they exist (:meth:`_relay_late`)."""
        targets = self._targets()
        for pid in targets:
            _signal(pid, signum)
        if not targets and (self.starting or self.current is not None):
            # (a thread may start here, in a signal handler: the handler runs as plain Python)
            threading.Thread(target=self._relay_late, args=(signum,), daemon=True).start()

    def _relay_late(self, signum: int) -> None:
        """Deliver ``signum`` to the starting phase's processes once its sandbox has started
        them; nothing once the phase is over; bubblewrap itself TERMed after
        :data:`LATE_RELAY_LIMIT` seconds (it then ends the sandbox)."""
        deadline = time.monotonic() + LATE_RELAY_LIMIT
        while time.monotonic() < deadline:
            phase = self.current
            if phase is None and not self.starting:
                return
            targets = self._targets()
            if targets:
                for pid in targets:
                    _signal(pid, signum)
                return
            if phase is not None and process_start_time(phase.pid) is None:  # ended (a zombie)
                return
            time.sleep(0.02)
        phase = self.current
        if phase is not None:
            _signal(phase.pid, signal.SIGTERM)

    def _on_signal(self, signum, _frame) -> None:
        """Rule 4: relay a stop to the node's processes, unless the backend already did (it
        does when this runner did not answer in time: :mod:`.stopping`)."""
        self.stopping = True
        if stopping.claim(NodeDir(Path(self.instructions.node_dir)).stop_claim, stopping.RUNNER):
            self._signal_all(signal.SIGTERM if signum == signal.SIGTERM else signum)

    def _with_env_fd(self, argv: list[str]) -> tuple[list[str], int | None]:
        """``argv`` reading the job's variables from a fresh descriptor (bubblewrap), and that
        descriptor (the caller passes it on and closes it); unchanged and None without them.

        The variables reach the sandbox as a file: a command line is readable by every user of
        the host; bubblewrap reads them from this descriptor.
        """
        if self.instructions.job_env is None:
            return argv, None
        env_fd = os.memfd_create("ma-job-env")
        data = env_file_data(self.instructions.job_env)
        while data:
            data = data[os.write(env_fd, data) :]
        os.lseek(env_fd, 0, os.SEEK_SET)
        return [str(env_fd) if a == ENV_FD else a for a in argv], env_fd

    def _agent_pids(self) -> set[int]:
        if self.agent is None:
            return set()
        return {self.agent.pid, *process_tree(self.agent.pid)}

    def _stop_agent(self) -> None:
        """End the kept command phase, its shell agent and every shell it serves: the release
        descriptor closed (the agent ends), then TERM and KILL after 5 s each."""
        if self.release is not None:
            os.close(self.release)
            self.release = None
        if self.agent is None:
            return
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            if signum is not None:
                for pid in sorted(self._agent_pids()):
                    _signal(pid, signum)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and self.agent.poll() is None:
                time.sleep(0.05)
            if self.agent.poll() is not None:
                break
        self.agent = None

    def _run(self, argv: list[str], *, unless_stopping: bool = False) -> int:
        """Run one phase to its end, reaping adopted orphans meanwhile; its exit code
        (``unless_stopping``: 128+SIGTERM without starting it once a stop came, rule 4).

        The command phase of a ``--debug-terminal`` node is the shell agent running the command
        (:mod:`.shell_agent`): its code comes from the agent's status descriptor, and a failed
        command's phase is kept alive (:attr:`agent`, :attr:`release`) for the terminal instead
        of being waited for (rule 3; :meth:`_keep_for_debugging`)."""
        # set before the check: a stop handled after it finds the phase starting (rule 4)
        self.starting = True
        try:
            if unless_stopping and self.stopping:
                return 128 + signal.SIGTERM
            return self._start_and_wait(argv)
        finally:
            self.starting = False

    def _start_and_wait(self, argv: list[str]) -> int:
        env = self.instructions.env
        cwd = self.instructions.cwd
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        copy_r = copy_w = None
        if COPY_FD in argv:
            # the phase fills the working copy first and writes the time it was complete here
            copy_r, copy_w = os.pipe()
            argv = [str(copy_w) if a == COPY_FD else a for a in argv]
        status_r = status_w = release_r = release_w = None
        if STATUS_FD in argv:
            # the agent reports the command's code here, and ends when release_w is closed
            status_r, status_w = os.pipe()
            release_r, release_w = os.pipe()
            fds = {STATUS_FD: str(status_w), RELEASE_FD: str(release_r)}
            argv = [fds.get(a, a) for a in argv]
        argv, env_fd = self._with_env_fd(argv)
        self._make_cgroup(first=False)
        passed = tuple(fd for fd in (env_fd, copy_w, status_w, release_r) if fd is not None)
        try:
            self.current = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a TERM to the runner's group must not hit bwrap
                preexec_fn=self._preexec(),
                pass_fds=passed,
            )
        except OSError as exc:
            for fd in (copy_r, status_r, release_w):
                if fd is not None:
                    os.close(fd)
            print(f"[ma_jupyter] cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        finally:
            for fd in passed:
                os.close(fd)
        self.starting = False  # the phase's process is current
        if copy_r is not None:
            self._record_copy(copy_r)
        if status_r is not None:
            reported = _read_status(status_r)
            if reported is not None and reported != 0 and self._keeps():
                self.agent, self.release = self.current, release_w  # kept: see run()
                self.current = None
                return reported
            os.close(release_w)  # the agent ends now
        status = self._wait(self.current.pid)
        self._kill_leftovers()
        self.current = None
        self._check_oom()
        if status_r is not None and reported is not None:
            return reported
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return os.WEXITSTATUS(status)

    def _keeps(self) -> bool:
        """Whether a failed command keeps its sandbox for the debug terminal (not after a stop)."""
        return not self.stopping and self.instructions.keep_failed_seconds > 0

    def _record_copy(self, fd: int) -> None:
        """Wait for the phase to report its working copy complete (a line: the time), and record
        it; nothing arrives when the copy failed (the phase ends, closing the pipe)."""
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if data.endswith(b"\n") and data.strip().isdigit():
            workdir.write_record(NodeDir(Path(self.instructions.node_dir)).workdir_record, int(data))

    def _wait(self, pid: int) -> int:
        while True:
            try:
                done, status = os.waitpid(-1, 0)  # also reaps orphans adopted as subreaper
            except ChildProcessError:
                # the child is gone without a status we could collect: report a failure, never success
                return 255 << 8
            if done == pid:
                return status

    def _kill_leftovers(self) -> None:
        """Kill what the finished command left running (background children, setsid'd ones)."""
        for _ in range(50):
            spared = self._agent_pids()  # the debug terminal lives as long as the node
            left = [pid for pid, _, state in descendants(os.getpid()) if state != "Z" and pid not in spared]
            for pid in left:
                _signal(pid, signal.SIGKILL)
            reap_ended()
            if not left:
                return
            time.sleep(0.02)

    def run(self) -> int:
        """Run the copy, on_start, the command, on_stop and the export; record and return the
        node's exit code."""
        given = self.instructions
        refused = isolate_network(given)  # first: before any thread, and before anything starts
        if refused:
            print(f"[ma_jupyter] {refused}", file=sys.stderr, flush=True)
            node_dir = NodeDir(Path(given.node_dir))
            write_report(node_dir.failure, {"reason": refused})
            write_exit_code(node_dir.exit_code, 126)
            return 126
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        cpus = set(given.cpus)
        if cpus and hasattr(os, "sched_setaffinity"):
            usable = cpus & os.sched_getaffinity(0)
            if usable:
                os.sched_setaffinity(0, usable)
        node_dir = NodeDir(Path(given.node_dir))
        # the end's records hold their disk from now on: a job that fills it still ends recorded
        for record in (node_dir.failure, node_dir.exit_code):
            reserve_room(record)
        if self.max_processes and given.own_user_namespace:
            # made before any thread starts: it forks a helper
            self.userns = node_user_namespace()
        if self.max_processes and given.sandbox == "bubblewrap" and self.userns is None and os.geteuid() == 0:
            _say("no user namespace of its own for this node here: its process limit is the watchdog's")
        self._make_cgroup(first=True)  # before any phase starts, and the watchdog (rule 1a)
        if given.cache_lease and hold_cache_lease(given.cache_lease) is None:  # rule 9
            _say("could not take the lease of the user's cache: a later job may release its build locks")
        threading.Thread(target=self._beat, args=(node_dir.heartbeat,), daemon=True).start()
        if watchdog.Limits(given, kernel_bound=False).watched():
            self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
            self._watchdog.start()
        if given.end_with:
            hostwatch.watch(given.end_with, self._end_with_host)
        code = 0
        if given.copy:  # the symlink mode: the runner runs as the job's account
            code = workdir.main(["copy", *given.copy])
            if code == 0:
                workdir.write_record(node_dir.workdir_record, time.time_ns())
        if code == 0 and given.on_start:  # nothing runs in an incomplete working copy
            code = self._run(given.on_start)
            if code != 0:
                print(f"[ma_jupyter] lifecycle on_start exited with code {code}", file=sys.stderr, flush=True)
        if code == 0 and not self.stopping:
            code = self._run(given.argv, unless_stopping=True)
        elif self.stopping:
            code = 128 + signal.SIGTERM
        if given.on_stop:
            stop_code = self._run(given.on_stop)
            if stop_code != 0:
                print(
                    f"[ma_jupyter] lifecycle on_stop exited with code {stop_code}",
                    file=sys.stderr,
                    flush=True,
                )
        keep = given.keep_failed_seconds
        # a failed command (not a stop) keeps its sandbox for the debug terminal (see _run)
        kept = code != 0 and self._keeps() and self.agent is not None and self.agent.poll() is None
        if not kept:
            self._stop_agent()
        self._ended.set()
        # a kill the watchdog began (a flood that filled the disk) ends with its cut of the
        # logs' overflow: the writes below need that room, and a runner that died on a full
        # disk would leave its node lost, with no exit code and no reason
        settled = self._watchdog is None
        if self._watchdog is not None:
            self._watchdog.join(WATCHDOG_SETTLE)
            settled = not self._watchdog.is_alive()
            if not settled:  # its cut and the one below must not both cut the same log
                _say(f"the watchdog did not end within {WATCHDOG_SETTLE:g} s; the logs' overflow stays")
        # logs past their cap (written between two of the watchdog's samples) give their
        # overflow back before anything more is written on that disk; where the watchdog acted,
        # it cut at its kill, and the lines said since stay
        if self.exceeded is None and settled:
            self.exceeded = watchdog.settle_logs(watchdog.Limits(given, kernel_bound=False), _say)
        self._export(node_dir)
        # the job could leave anything there (a FIFO, a symlink): never follow or read it here
        for report in (FAILURE_REPORT, NOT_DISTRIBUTED_REPORT):
            collect_report(Path(given.rank_log_dir), node_dir.root, given.node, report)
        # the records go into the room reserved at the start; past it, all of them wait for room
        # together, within one bound
        deadline = time.monotonic() + END_WRITE_WAIT
        if self.exceeded:  # the runner's own report wins over the launcher's
            write_end(write_report, node_dir.failure, {"reason": self.exceeded}, deadline, _say)
            code = code or 128 + signal.SIGKILL
        if self.host_gone:
            write_end(write_report, node_dir.failure, {"reason": self.host_gone}, deadline, _say)
            code = code or 128 + signal.SIGTERM
        if kept:  # recorded before the exit code, which ends the job: its events can say so
            until = time.time() + keep
            write_end(write_report, node_dir.kept, {"until": until}, deadline, _say)
        if not kept:
            self._remove_cgroup()  # before the exit code: the job's end finds it gone
        write_end(write_exit_code, node_dir.exit_code, code, deadline, _say)
        self._recorded.set()
        if kept:
            self._keep_for_debugging(until)
            self._remove_cgroup()
        return code

    def _remove_cgroup(self) -> None:
        if self.cgroup is not None and not self.cgroup.remove():
            _say(f"the node's cgroup {self.cgroup.memory} still holds processes: left for the next sweep")

    def _keep_for_debugging(self, until: float) -> None:
        """Keep the failed command's phase, its shell agent serving the terminal in the node's
        own sandbox (its processes' namespaces, ``/tmp``, ``/dev/shm``, mounts), until
        ``until``, a stop signal (the job deleted, or a new attempt) or the agent's own end;
        then end it."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until))
        print(
            f"[ma_jupyter] the command failed: this node's sandbox stays for the debug terminal until {stamp}",
            file=sys.stderr,
            flush=True,
        )
        while time.time() < until and not self.stopping and self.agent.poll() is None:
            time.sleep(0.5)
        self._stop_agent()

    def _export(self, node_dir: NodeDir) -> None:
        """Keep what the job wrote in its working copy, when anything changed since the copy (a
        look at file times, following no link: most nodes write nothing there)."""
        since = workdir.read_record(node_dir.workdir_record)
        export, folder = self.instructions.export, self.instructions.workdir
        if not export or since is None or not folder or not workdir.changed_since(folder, since):
            return
        code = self._run([*export, str(since)])
        if code != 0:
            print(
                f"[ma_jupyter] keeping the working directory's files ended with code {code}",
                file=sys.stderr,
                flush=True,
            )


def isolate_network(given: RunnerInstructions) -> str | None:
    """Put the runner, and so everything it starts, where the node's network rules hold (see
    :mod:`.network` and :mod:`.fence`): into the node's namespace (``netns``: its file; with ``switch``, the file
    of its job network's switch, held open first for the runner's life), or behind the fence
    (``deny_tcp``: the ports it may not connect to); None when done, else why not (the node then
    runs nothing: never on a network it should not have)."""
    if not given.netns and given.deny_tcp is None:
        return None
    from . import fence, network

    try:
        if given.switch:
            network.hold_switch(given.switch)
        if given.netns:
            network.enter(given.netns)
        if given.deny_tcp is not None:
            fence.fence(given.deny_tcp)
    except OSError as exc:
        return f"the node's network cannot be isolated: {exc.strerror or exc}"
    return None


def _read_status(fd: int) -> int | None:
    """The exit code the shell agent reports on ``fd`` (one line), which is then closed; None
    when the agent ended without one (killed: the phase's own status tells)."""
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 64:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
    except OSError:
        data = b""
    finally:
        os.close(fd)
    try:
        return int(data) if data.endswith(b"\n") else None
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the node described by the JSON file named in ``argv``
    (``--check-user-namespace ARGV...``: :func:`check_user_namespace` of that sandbox argv)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == CHECK_USER_NAMESPACE:
        return check_user_namespace(args[1:])
    if len(args) != 1:
        print("usage: python -m ma_jupyter.nodehost.noderun <node-run.json>", file=sys.stderr)
        return 2
    try:
        instructions = RunnerInstructions.read(args[0])
    except (OSError, ValueError) as exc:  # the node runs nothing it was not clearly told
        _say(f"cannot read the runner's instructions: {exc}")
        return 2
    return NodeRunner(instructions).run()


if __name__ == "__main__":
    code = main()
    # the exit code is on disk: end now rather than after the interpreter's teardown (its daemon
    # threads and modules), which would only delay the node's end
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
