"""Run a command with fake card device nodes: ``unshare --mount --propagation private python
fake_dev.py N -- command...`` (as root).

Inside the private mount namespace, ``/dev`` becomes a tmpfs holding copies of the host's
``/dev`` entries a sandbox needs (``null``, ``zero``, ``full``, ``random``, ``urandom``, ``tty``,
``shm``, ``pts``...) plus ``nvidia0..nvidia<N-1>``, ``nvidiactl``, ``nvidia-uvm``,
``nvidia-uvm-tools`` and ``nvidia-caps/`` made with ``mknod`` from ``/dev/null``'s numbers (mode
0666, so any account can open them, like the real ones).  Nothing changes outside the namespace.
"""

import os
import shutil
import subprocess
import sys


def main() -> None:
    count = int(sys.argv[1])
    assert sys.argv[2] == "--"
    command = sys.argv[3:]
    null = os.stat("/dev/null")
    staging = "/run/ma-fake-dev"
    os.makedirs(staging, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", staging], check=True)
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        subprocess.run(["cp", "-a", f"/dev/{name}", f"{staging}/{name}"], check=True)
    for name in ("fd", "stdin", "stdout", "stderr", "ptmx"):
        if os.path.islink(f"/dev/{name}"):
            os.symlink(os.readlink(f"/dev/{name}"), f"{staging}/{name}")
    for folder in ("shm", "pts", "mqueue"):
        os.makedirs(f"{staging}/{folder}", exist_ok=True)
    nodes = [f"nvidia{i}" for i in range(count)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    for name in nodes:
        os.mknod(f"{staging}/{name}", 0o020666, null.st_rdev)
        os.chmod(f"{staging}/{name}", 0o666)
    os.makedirs(f"{staging}/nvidia-caps", mode=0o755)
    os.mknod(f"{staging}/nvidia-caps/nvidia-cap1", 0o020400, null.st_rdev)
    # the host's shared memory and terminals stay reachable at their places
    for folder in ("shm", "pts"):
        if os.path.ismount(f"/dev/{folder}"):
            subprocess.run(["mount", "--bind", f"/dev/{folder}", f"{staging}/{folder}"], check=True)
    subprocess.run(["mount", "--move", staging, "/dev"], check=True)
    shutil.rmtree(staging, ignore_errors=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
