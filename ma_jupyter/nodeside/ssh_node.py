"""OpenSSH between a job's nodes: each node's sshd, the attempt's keys, and the login that gives
a command arriving over ssh the node's own environment.

``python -m ma_jupyter.nodeside.ssh_node --listen ADDRESS [--wait HOST,...] [-- COMMAND...]``
runs inside a node's sandbox, as the job's account (the horovod and pytorch_deepspeed modes put
it in front of every node's command, see :mod:`ma_jupyter.modes.ssh`).  In this order:

1. it derives the attempt's two key pairs from the attempt's secret (``$MA_JOB_SECRET``, the
   same on every node of one attempt and on no other): the job's user key and the host key every
   node of the attempt shows.  Deriving them (HMAC-SHA256 of the secret, then Ed25519) rather
   than shipping them keeps the key pair per attempt without a file travelling between machines;
   whoever holds the secret could make them, and only the job's own nodes do;
2. it writes them into :data:`KEY_DIR` (``~/.ssh`` of the node's account, ``HOME`` being
   ``/tmp``, the sandbox's own memory-backed ``/tmp``), 0600 in a 0700 folder of the job's
   account: ``id_ed25519``, ``authorized_keys`` (the user key only), ``known_hosts`` (the host
   key under the alias :data:`HOST_KEY_ALIAS`, which the node's ``/etc/ssh/ssh_config`` names for
   every host), the host key, ``sshd_config`` and ``environment.json``: the node's variables and
   working directory as this helper got them;
3. it starts ``/usr/sbin/sshd -D -e`` on ``ADDRESS:$SSHD_PORT`` only (the node's own address,
   so every node of a job may use one port number where they share a network namespace), with
   public-key login only, for this key only; sshd runs as the job's account, so a login can only
   be that account's, inside this sandbox: its hostname, mounts and processes;
4. with ``--wait``, it waits until each named peer's sshd accepts a connection (at most
   ``$MA_SSH_WAIT_SECONDS``, default 300) so the job's launcher (mpirun, DeepSpeed's pdsh) never
   meets a peer that is not up yet; a peer that never comes up ends the node with exit code 255
   and its name;
5. without COMMAND it becomes sshd (the waiting nodes); with COMMAND it runs COMMAND in its
   place (exec: signals and the exit code are the command's; sshd ends with the sandbox).

Every login runs ``--login`` (sshd's ``ForceCommand``): it replaces sshd's minimal environment
with ``environment.json`` (the node's variables: ``PATH``, ``PYTHONPATH``, the job's ``env``,
the platform's ``MA_``, ``RANK`` ...), keeps sshd's ``SSH_*`` and ``TERM``, enters the node's
working directory and runs the command with ``/bin/sh -c`` (no command: a login shell).  So a
command over ssh sees exactly what the node's own command sees, as ModelArts' and Kubeflow's
MPI workers do with an environment file.  Standard library only: it runs under the job's own
interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shlex
import socket
import stat
import struct
import subprocess
import sys
import time

#: the node account's ``~/.ssh`` (the node's HOME is /tmp, its passwd says so)
KEY_DIR = "/tmp/.ssh"
#: the one name every node's host key is known by (``HostKeyAlias`` in the client's config)
HOST_KEY_ALIAS = "ma_jupyter-job-node"
SSHD = "/usr/sbin/sshd"
SECRET_ENV = "MA_JOB_SECRET"
PORT_ENV = "SSHD_PORT"
WAIT_ENV = "MA_SSH_WAIT_SECONDS"
USAGE = "usage: python -m ma_jupyter.nodeside.ssh_node --listen ADDRESS [--wait HOST,...] [-- COMMAND...]"

# ------------------------------------------------------------------------------ Ed25519 (RFC 8032)

_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P


def _x_of(y: int) -> int:
    xx = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(xx, (_P + 3) // 8, _P)
    if (x * x - xx) % _P:
        x = x * pow(2, (_P - 1) // 4, _P) % _P
    return _P - x if x & 1 else x


_GY = 4 * pow(5, _P - 2, _P) % _P
_GX = _x_of(_GY)
_G = (_GX, _GY, 1, _GX * _GY % _P)


def _add(a: tuple, b: tuple) -> tuple:
    e1 = (a[1] - a[0]) * (b[1] - b[0]) % _P
    e2 = (a[1] + a[0]) * (b[1] + b[0]) % _P
    c = 2 * a[3] * b[3] * _D % _P
    d = 2 * a[2] * b[2] % _P
    e, f, g, h = e2 - e1, d - c, d + c, e2 + e1
    return (e * f, g * h, f * g, e * h)


def ed25519_public(seed: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte private seed (RFC 8032 5.1.5)."""
    digest = hashlib.sha512(seed).digest()
    scalar = int.from_bytes(digest[:32], "little")
    scalar &= (1 << 254) - 8
    scalar |= 1 << 254
    point, base = (0, 1, 1, 0), _G
    while scalar:
        if scalar & 1:
            point = _add(point, base)
        base = _add(base, base)
        scalar >>= 1
    zinv = pow(point[2], _P - 2, _P)
    x, y = point[0] * zinv % _P, point[1] * zinv % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


# ------------------------------------------------------------------------------ OpenSSH formats


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def public_line(public: bytes, comment: str = "") -> str:
    """``ssh-ed25519 AAAA... [comment]``: a public key as authorized_keys and known_hosts hold it."""
    blob = _string(b"ssh-ed25519") + _string(public)
    return " ".join(["ssh-ed25519", base64.b64encode(blob).decode(), comment]).rstrip()


def private_file(seed: bytes, public: bytes, comment: str) -> str:
    """An unencrypted OpenSSH private key file (``openssh-key-v1``) holding one Ed25519 key."""
    check = hashlib.sha256(seed).digest()[:4]  # any value, the same twice
    blob = _string(b"ssh-ed25519") + _string(public)
    private = check + check + blob + _string(seed + public) + _string(comment.encode())
    private += bytes(range(1, 1 + (-len(private) % 8)))
    body = b"openssh-key-v1\0" + _string(b"none") + _string(b"none") + _string(b"")
    body += struct.pack(">I", 1) + _string(blob) + _string(private)
    text = base64.b64encode(body).decode()
    lines = [text[i : i + 70] for i in range(0, len(text), 70)]
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH PRIVATE KEY-----\n"
    )


def derive_seed(secret: str, purpose: str) -> bytes:
    """A 32-byte Ed25519 seed for ``purpose`` (``user``, ``host``) from the attempt's secret."""
    return hmac.new(secret.encode(), f"ma_jupyter ssh {purpose} key".encode(), hashlib.sha256).digest()


def sshd_config(address: str, port: str, login: str) -> str:
    """The node's sshd configuration (see the module docstring, rule 3)."""
    return "\n".join(
        [
            f"ListenAddress {address}:{port}",
            f"HostKey {KEY_DIR}/ssh_host_ed25519_key",
            f"AuthorizedKeysFile {KEY_DIR}/authorized_keys",
            "PidFile none",
            "UsePAM no",
            # /tmp, on the way to the keys, is every account's (sticky, world-writable): the
            # folder and files themselves are the account's own, 0700 and 0600
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "PermitRootLogin prohibit-password",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PermitTunnel no",
            "PrintMotd no",
            "PrintLastLog no",
            # launchers open one connection per node at once (pdsh, mpirun without its tree)
            "MaxStartups 256:30:512",
            "MaxSessions 256",
            "LogLevel ERROR",
            f"ForceCommand {login}",
            "",
        ]
    )


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _own_folder(path: str) -> None:
    """KEY_DIR as a real folder of this account, 0700 (a link or another's folder refused)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SystemExit(f"ssh_node: {path} is not a folder of this account: remove it")
    os.chmod(path, 0o700)


def write_files(secret: str, address: str, port: str) -> str:
    """Rules 1 and 2 of the module docstring; the sshd_config's path."""
    _own_folder(KEY_DIR)
    user_seed, host_seed = derive_seed(secret, "user"), derive_seed(secret, "host")
    user_public, host_public = ed25519_public(user_seed), ed25519_public(host_seed)
    job = os.environ.get("MA_JOB_ID", "job")
    _write_private(f"{KEY_DIR}/id_ed25519", private_file(user_seed, user_public, f"ma_jupyter {job}"))
    _write_private(f"{KEY_DIR}/id_ed25519.pub", public_line(user_public, f"ma_jupyter {job}") + "\n")
    # restrict: no forwarding of any kind; pty: an interactive `ssh worker-1` still gets a terminal
    _write_private(f"{KEY_DIR}/authorized_keys", "restrict,pty " + public_line(user_public, job) + "\n")
    _write_private(f"{KEY_DIR}/known_hosts", f"{HOST_KEY_ALIAS} {public_line(host_public)}\n")
    _write_private(f"{KEY_DIR}/ssh_host_ed25519_key", private_file(host_seed, host_public, HOST_KEY_ALIAS))
    _write_private(f"{KEY_DIR}/environment.json", json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}))
    login = " ".join(
        shlex.quote(p) for p in (sys.executable, "-I", "-S", os.path.abspath(__file__), "--login")
    )
    config = f"{KEY_DIR}/sshd_config"
    _write_private(config, sshd_config(address, port, login))
    return config


def _resolve(host: str, port: int) -> tuple:
    return socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]


def wait_for_peers(peers: list[str], port: int, seconds: float, sshd: subprocess.Popen) -> str | None:
    """Rule 4: None once every peer's sshd accepts a connection, else why not."""
    deadline = time.monotonic() + seconds
    for peer in peers:
        while True:
            if sshd.poll() is not None:
                return f"this node's sshd ended with code {sshd.returncode}"
            try:
                with socket.create_connection(_resolve(peer, port), timeout=5) as sock:
                    # its banner, then ours: a bare connect-and-close makes sshd log an error
                    banner = sock.recv(256)
                    sock.sendall(b"SSH-2.0-ma_jupyter_wait\r\n")
                if banner.startswith(b"SSH-"):
                    break
                raise OSError(f"not an ssh server: {banner[:40]!r}")
            except OSError as exc:
                if time.monotonic() >= deadline:
                    return f"the sshd of {peer} did not answer on port {port} within {seconds:.0f} s ({exc})"
                time.sleep(0.02)  # a local sshd listens within tens of milliseconds
    return None


def serve(address: str, peers: list[str], command: list[str]) -> int:
    """Rules 1 to 5 of the module docstring."""
    secret, port = os.environ.get(SECRET_ENV, ""), os.environ.get(PORT_ENV, "")
    if not secret or not port.isdigit():
        print(
            f"ssh_node: {SECRET_ENV} and {PORT_ENV} must be set: run it inside a job's node", file=sys.stderr
        )
        return 2
    if not os.access(SSHD, os.X_OK):
        print(f"ssh_node: {SSHD} is not installed on this machine (Debian: openssh-server)", file=sys.stderr)
        return 127
    config = write_files(secret, address, port)
    argv = [SSHD, "-D", "-e", "-f", config]
    if not command:
        os.execv(SSHD, argv)
    sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    peers = [p for p in peers if p]
    seconds = float(os.environ.get(WAIT_ENV, "300") or 300)
    failed = wait_for_peers([*peers, address], int(port), seconds, sshd)
    if failed:
        print(f"ssh_node: {failed}", file=sys.stderr, flush=True)
        return 255
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"ssh_node: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127


def login() -> int:
    """A login's command with the node's environment (the module docstring's last paragraph)."""
    with open(f"{KEY_DIR}/environment.json") as fh:
        saved = json.load(fh)
    env = dict(saved["env"])
    for name, value in os.environ.items():
        if name.startswith("SSH_") or name == "TERM":
            env[name] = value
    try:
        os.chdir(saved["cwd"])
    except OSError:
        pass
    command = os.environ.get("SSH_ORIGINAL_COMMAND")
    if command is not None:
        os.execve("/bin/sh", ["sh", "-c", command], env)
    shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"
    os.execve(shell, ["-" + os.path.basename(shell)], env)
    return 127


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--login"]:
        return login()
    command: list[str] = []
    if "--" in args:
        command = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    options = dict(zip(args[::2], args[1::2], strict=False))
    if len(args) % 2 or not options.get("--listen") or set(options) - {"--listen", "--wait"}:
        print(USAGE, file=sys.stderr)
        return 2
    return serve(options["--listen"], options.get("--wait", "").split(","), command)


if __name__ == "__main__":
    sys.exit(main())
