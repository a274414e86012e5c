"""``[network] egress`` (issue 36, item 5): what the admin may write, and what the service
refuses rather than ignores (the gate itself is tested on a real service,
tests/service/test_job_egress.py)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from ma_jupyter import config
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.nodehost import egress, egress_names
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def _policy(tmp_path: Path, egress_value: str, extra: str = "") -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(f"{extra}[network]\negress = {egress_value}\n")
    return path


def test_entries_are_read_as_written(tmp_path):
    path = _policy(
        tmp_path, '["10.0.0.0/8:443", "Mirror.Local:3128", "192.0.2.7", "198.51.100.0/24:80,8000-8100"]'
    )
    rules = config.load_egress(path)
    assert [(r.host, r.network, r.ports) for r in rules] == [
        (None, "10.0.0.0/8", ((443, 443),)),
        ("mirror.local", None, ((3128, 3128),)),
        (None, "192.0.2.7/32", ()),
        (None, "198.51.100.0/24", ((80, 80), (8000, 8100))),
    ]
    assert config.load_egress(_policy(tmp_path, '"none"')) is None
    (tmp_path / "cluster.toml").write_text("[mounts]\n")
    assert config.load_egress(tmp_path / "cluster.toml") is None  # the default: nothing


@pytest.mark.parametrize(
    "value, says",
    [
        ('["10.0.0.0/8:0"]', "ports run from 1 to 65535"),
        ('["10.0.0.0/8:http"]', "is not a port"),
        ('["10.0.0.0/33"]', "not an IPv4 address or network"),
        ('["bad host!"]', "not a host name"),
        ('["::1"]', "is not a port"),
        ('["127.0.0.1:80"]', "the machine's own loopback"),
        ('["10.254.0.0/24"]', "every job's own network"),
        ('["localhost"]', "localhost is the machine itself"),
        ("[443]", 'must be "none" or a list of destinations'),
        ('"all"', 'is "none" or a list'),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_file_and_the_key(tmp_path, value, says):
    path = _policy(tmp_path, value)
    with pytest.raises(InvalidSpec) as caught:
        config.load_egress(path)
    assert str(path) in caught.value.message and "[network] egress" in caught.value.message
    assert says in caught.value.message


def test_another_key_of_network_is_refused(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('[network]\nallow = ["10.0.0.0/8"]\n')
    with pytest.raises(InvalidSpec, match=r"\[network\] has no key 'allow': use egress"):
        config.load_egress(path)


def _start_check(home: Path, *, user: int | None = None) -> subprocess.CompletedProcess:
    """The service's start-up check of its backend and policy, as the service would run it."""
    code = (
        "import sys\n"
        "from ma_jupyter.errors import MaJupyterError\n"
        "from ma_jupyter.service.__main__ import make_backend\n"
        "try:\n    make_backend()\nexcept MaJupyterError as exc:\n    print(exc.message); sys.exit(2)\n"
    )
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    env = {**os.environ, "MA_JUPYTER_HOME": str(home), "PYTHONPATH": str(REPO), "MA_JUPYTER_CARDS": "none"}
    return subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_policy_the_service_cannot_enforce_stops_its_start(tmp_path):
    # a Ray cluster file that fences every job: its nodes keep their machines' network
    home = tmp_path / "ray"
    home.mkdir()
    ray = '[backend]\nkind = "ray"\naddress = "127.0.0.1:1"\nnetwork = "fence"\n\n'
    _policy(home, '["192.0.2.7:443"]', ray)
    done = _start_check(home)
    assert done.returncode == 2, done.stderr
    assert 'network = "fence" keeps the machines\' network for every job' in done.stdout, done.stdout
    assert 'set network = "auto"' in done.stdout, done.stdout
    # an address of this machine itself
    own = next(
        (
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not ipaddress.IPv4Address(a.address).is_loopback
        ),
        None,
    )
    if own is not None and os.geteuid() == 0 and egress.nft_program():
        home = tmp_path / "own"
        home.mkdir()
        _policy(home, f'["{own}:22"]')
        done = _start_check(home)
        assert done.returncode == 2 and "this machine's own address" in done.stdout, done.stdout + done.stderr
        # on the Ray backend too (the service's machine: never reached from a Ray job either)
        _policy(home, f'["{own}:22"]', '[backend]\nkind = "ray"\naddress = "127.0.0.1:1"\n\n')
        done = _start_check(home)
        assert done.returncode == 2 and "this machine's own address" in done.stdout, done.stdout + done.stderr


def test_a_fenced_ray_attempt_with_a_policy_is_refused_and_a_gate_refuses_the_cluster(tmp_path, monkeypatch):
    """A Ray attempt that could not get its overlay would share its machines' whole network: with
    a policy its launch is refused, saying why and what to do.  A Ray attempt's gate never opens
    the cluster's addresses or ports, whatever the list says, and its rules hold no overlapping
    set elements (nft refuses them)."""
    from ma_jupyter.backends.ray import egress_gate
    from ma_jupyter.errors import BackendUnavailable

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    _policy(tmp_path, '["192.0.2.0/24"]')
    with pytest.raises(BackendUnavailable) as caught:
        egress_gate.gated(None, None, None)  # fenced: refused before anything is asked of Ray
    assert "would be fenced" in caught.value.message and 'egress = "none"' in caught.value.message
    assert str(tmp_path / "cluster.toml") in caught.value.message
    gate = egress.Gate(
        (egress.Destination(ipaddress.IPv4Network("192.0.2.0/24")),),
        job_network=egress_gate.OVERLAY_NETWORK,
        refused=(ipaddress.IPv4Network("192.0.2.5/32"), ipaddress.IPv4Network("127.0.0.1/32")),
        denied_ports=((6379, 6379), (20000, 20499), (20400, 20999), (6380, 6380)),
    )
    assert gate.allows("192.0.2.9", 443) and gate.gateway == "10.253.255.254"
    assert not gate.allows("192.0.2.5", 443)  # a Ray node's (or the service's) address
    assert not gate.allows("192.0.2.9", 6379) and not gate.allows("192.0.2.9", 20700)  # the cluster's ports
    assert not gate.allows("10.253.0.2", 443)  # the overlay: the job's own nodes, never relayed
    rules = egress.ruleset(gate, [ipaddress.IPv4Address("127.0.0.1")])
    assert "tcp dport { 6379-6380, 20000-20999 } return" in rules, rules
    assert "ip daddr { 127.0.0.0/8, 192.0.2.5/32 } return" in rules, rules
    assert "ip daddr 10.253.0.0/16 accept" in rules and "10.254." not in rules, rules


def test_a_ray_gate_denies_every_machines_raylet_and_worker_ports_on_any_address(tmp_path, monkeypatch):
    """A Ray machine may be reachable at a second address that a policy lists (a LAN range): its
    workers' ports (unauthenticated, they run what they are sent) are denied there too, for each
    machine whose agent answered, not only on the machine of the node that connects."""
    from types import SimpleNamespace

    from ma_jupyter.backends.ray import egress_gate
    from ma_jupyter.nodehost.overlay import Overlay, Segment

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    _policy(tmp_path, '["192.0.2.0/24"]')
    ray = SimpleNamespace(
        nodes=lambda: [{"NodeManagerAddress": "198.51.100.7", "NodeManagerPort": 6380}],
        get_runtime_context=lambda: SimpleNamespace(gcs_address="198.51.100.7:6379"),
    )
    attempt = SimpleNamespace(job_id="j-1", spec=SimpleNamespace(creator="alice"))
    part = Overlay(own=Segment("198.51.100.7", 40000, 7, ("10.253.0.1",)), peers=())
    agents = [
        {"ray_ports": [[6380, 6381], [(20000, 20499)]]},  # this machine's raylet
        {"ray_ports": [[7380], [(30000, 30499)]]},  # another machine's
        {},  # an agent of an older version says nothing: nothing added
    ]
    gate = egress_gate.gated({"n1": part}, attempt, ray, agents)["n1"].egress
    assert gate.allows("192.0.2.9", 443)
    for port in (6379, 6380, 6381, 7380, 20000, 20499, 30000, 30250, 30499):
        assert not gate.allows("192.0.2.9", port), port  # on an address the policy lists
    assert gate.allows("192.0.2.9", 30500)
    assert not gate.allows("198.51.100.7", 443)  # a Ray node's own address: never


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the check as another account")
def test_a_service_of_an_ordinary_user_refuses_a_policy_at_its_start():
    # a home that account can reach (the test's own temporary folders are root's alone)
    with tempfile.TemporaryDirectory(prefix="ma-egress-") as folder:
        home = Path(folder)
        home.chmod(0o755)
        _policy(home, '["192.0.2.7:443"]')
        os.chown(home, 65534, 65534)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        can = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            "import ma_jupyter",
        ]
        if subprocess.run(can, capture_output=True, env=env, timeout=60).returncode:
            pytest.skip("this checkout or interpreter cannot be read by another account")
        done = _start_check(home, user=65534)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "runs as an ordinary user" in done.stdout and "[network] egress" in done.stdout


def test_names_are_resolved_at_attempt_start_and_never_to_the_machine_itself():
    rules = [
        config.EgressRule("localhost", "localhost", None, ()),
        config.EgressRule("x.invalid", "no-such-host.invalid", None, ((80, 80),)),
        config.EgressRule("192.0.2.7:443", None, "192.0.2.7/32", ((443, 443),)),
    ]
    gate = egress.resolve(rules)
    assert gate.hosts == ()
    assert [p.split(":")[0] for p in gate.problems] == ["localhost", "no-such-host.invalid"]
    assert "this machine's own address" in gate.problems[0]
    assert egress.hosts_lines(gate).splitlines() == [
        f"# [network] egress left out {p}" for p in gate.problems
    ]
    assert gate.allows("192.0.2.7", 443) and not gate.allows("192.0.2.7", 80)
    assert not gate.allows("127.0.0.1", 443) and not gate.allows("10.254.0.2", 443)


def test_a_broad_destination_never_opens_the_link_local_metadata_service():
    """169.254.169.254 answers with the machine's cloud identity: an entry such as 0.0.0.0/0 or
    169.254.0.0/16 never reaches it, only one naming exactly that address."""
    from ma_jupyter.nodehost import egress

    def gate(net: str) -> egress.Gate:
        return egress.Gate(destinations=(egress.Destination(ipaddress.IPv4Network(net)),))

    assert not gate("0.0.0.0/0").allows("169.254.169.254", 80)
    assert not gate("169.254.0.0/16").allows("169.254.169.254", 80)
    assert gate("0.0.0.0/0").allows("192.0.2.7", 80)
    assert gate("169.254.169.254/32").allows("169.254.169.254", 80)


def test_the_relays_bounds_are_read_with_their_defaults_and_refused_out_of_range(tmp_path):
    path = _policy(tmp_path, '"none"')
    assert config.load_egress_bounds(path) == config.EgressBounds()
    assert config.EgressBounds() == config.EgressBounds(
        idle_timeout=300, connect_timeout=10, relays_per_user=128
    )
    path.write_text(
        '[network]\negress = ["192.0.2.7:443"]\negress_idle_timeout = 2.5\n'
        "egress_connect_timeout = 3\negress_relays_per_user = 7\n"
    )
    assert config.load_egress(path) is not None
    assert config.load_egress_bounds(path) == config.EgressBounds(2.5, 3, 7)
    for key, value, says in [
        ("egress_idle_timeout", "0", "between 1 and 86400"),
        ("egress_idle_timeout", "100000", "between 1 and 86400"),
        ("egress_connect_timeout", "301", "between 1 and 300"),
        ("egress_relays_per_user", "1.5", "a whole number"),
    ]:
        path.write_text(f"[network]\n{key} = {value}\n")
        with pytest.raises(InvalidSpec) as caught:
            config.load_egress_bounds(path)
        assert str(path) in caught.value.message and key in caught.value.message, caught.value.message
        assert says in caught.value.message, caught.value.message


def test_a_launch_never_waits_on_a_name_server(monkeypatch):
    """A name server that does not answer holds a look-up of the background, never the launch:
    the attempt's gate is made at once, the name left out with its line; once the look-up
    answers, the next attempt has the name."""
    import threading

    answer = threading.Event()
    asked: list[str] = []

    def slow_name_server(name: str) -> tuple[str, ...]:
        asked.append(name)
        answer.wait(120)
        return ("192.0.2.9",)

    monkeypatch.setattr(egress_names, "_look_up", slow_name_server)
    monkeypatch.setattr(egress_names, "NAMES", egress_names.Names())
    rules = [config.EgressRule("slow.example:443", "slow.example", None, ((443, 443),))]
    try:
        gate = egress.gate_for(rules, "alice")  # returns while the look-up hangs
        assert gate.hosts == () and gate.destinations == () and gate.user == "alice"
        assert gate.problems == (
            "slow.example: not looked up yet (it is now, in the background: the job's next attempt gets it)",
        )
        assert "# [network] egress left out slow.example: not looked up yet" in egress.hosts_lines(gate)
        wait_for(lambda: asked == ["slow.example"], timeout=60)
        assert egress.gate_for(rules).hosts == ()  # still hanging: still not waited on
        assert asked == ["slow.example"]  # one look-up of a name at once
    finally:
        answer.set()
    wait_for(lambda: egress.gate_for(rules).hosts, timeout=60)
    gate = egress.gate_for(rules)
    assert gate.hosts == (("192.0.2.9", "slow.example"),) and gate.problems == ()
    assert gate.allows("192.0.2.9", 443) and not gate.allows("192.0.2.9", 80)


def test_a_look_up_done_before_its_callback_is_attached_never_locks_the_cache(monkeypatch):
    """A name answered at once (from the resolver's own cache) may be done before its callback
    is attached; the callback then runs on the cache's thread, which must not hold the lock
    then: every launch's gate would wait for it forever."""
    import threading
    from concurrent.futures import Future

    class AtOnce:
        """A pool whose look-ups are done when ``submit`` returns."""

        def submit(self, fn, *args):
            done: Future = Future()
            done.set_result(fn(*args))
            return done

    names = egress_names.Names()
    names._pool = AtOnce()
    monkeypatch.setattr(egress_names, "_look_up", lambda name: ("192.0.2.9",))
    monkeypatch.setattr(egress_names, "NAMES", names)
    rules = [config.EgressRule("quick.example:443", "quick.example", None, ((443, 443),))]

    def gates() -> None:
        egress.gate_for(rules)  # asks for the name: the cache's thread looks it up
        wait_for(lambda: egress.gate_for(rules).hosts == (("192.0.2.9", "quick.example"),), timeout=30)

    caller = threading.Thread(target=gates, daemon=True)  # a locked cache must fail the test, not hang it
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "the name cache's lock was never given back"
    assert egress.gate_for(rules).hosts == (("192.0.2.9", "quick.example"),)


MANY = r"""
import subprocess, sys
subprocess.run(["mount", "--bind", sys.argv[1], "/etc/hosts"], check=True)
from ma_jupyter import config
from ma_jupyter.nodehost import egress
gate = egress.resolve([config.EgressRule("many.example:443", "many.example", None, ((443, 443),))])
print("RESULT", len(gate.hosts), len(gate.destinations), len(egress.hosts_lines(gate).splitlines()))
print("PROBLEMS", *gate.problems, sep="\n")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a mount namespace for /etc/hosts)")
def test_a_name_answering_with_many_addresses_opens_a_bounded_gate(tmp_path):
    """A listed name whose owner answers with hundreds of addresses (here a test-local
    ``/etc/hosts`` in a mount namespace of the test's own) gives the gate its first
    ``MAX_NAME_ADDRESSES`` only: each would be a rule of every attempt's gate and a line of
    every node's ``/etc/hosts``, and the cache keeps no more; the name's line says so."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"203.0.113.{i} many.example\n" for i in range(1, 201)))
    done = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", MANY, str(hosts)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout + done.stderr
    cap = egress_names.MAX_NAME_ADDRESSES
    assert line.split()[1:] == [str(cap), str(cap), str(cap + 1)], done.stdout
    assert f"many.example: resolves to more than {cap} addresses" in done.stdout, done.stdout
