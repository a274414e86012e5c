"""An object storage endpoint whose name answers differently after the submit's check (DNS
rebinding) never gets a connection to the address the check refuses: the transfers connect
through ``endpoint_guard``, which checks the address it connects to.

The hostile name lives in a test-local resolver: the child process runs in a mount namespace of
its own, where a file of the test's is bind-mounted over ``/etc/hosts`` (glibc reads it at each
lookup, the service's and the client library's alike: no resolver of the process is patched),
and in a network namespace of its own, where ``8.8.8.8`` (a public address) is an address of
its loopback: a stand-in for the endpoint's public server, and listeners on both addresses
record every connection they get.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import json, os, socket, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

hosts = sys.argv[1]
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "8.8.8.8/32", "dev", "lo"], check=True)

seen = {"8.8.8.8": [], "127.0.0.1": []}

class Answer(BaseHTTPRequestHandler):
    def do_GET(self):  # an empty listing, as S3 answers one
        seen[self.server.server_address[0]].append(self.path)
        body = b'<?xml version="1.0"?><ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

public = ThreadingHTTPServer(("8.8.8.8", 0), Answer)
port = public.server_address[1]
inner = ThreadingHTTPServer(("127.0.0.1", port), Answer)  # what the rebinding aims at
for server in (public, inner):
    threading.Thread(target=server.serve_forever, daemon=True).start()

from ma_jupyter import objectstore
from ma_jupyter.errors import StorageError

endpoint = f"http://rebind.example:{port}"
creds = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "k", "AWS_ENDPOINT_URL": endpoint}
out = {}
with open(hosts, "w") as f:
    f.write("8.8.8.8 rebind.example\n")
objectstore.check_endpoint(creds)  # the submit's check: a public address
out["public"] = len(objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/a"), creds, endpoint))
with open(hosts, "w") as f:  # the name now answers with loopback
    f.write("127.0.0.1 rebind.example\n")
try:
    objectstore.listing(objectstore.ObjectURI.parse("s3://bkt/b"), creds, endpoint, timeout=5.0)
    out["rebound"] = "listed"
except StorageError as exc:
    out["rebound"] = str(exc)
out["seen"] = seen
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_name_that_rebinds_after_the_check_never_reaches_the_refused_address(tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        ["unshare", "--mount", "--net", sys.executable, "-c", CHILD, str(hosts)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout + done.stderr
    out = json.loads(line[len("RESULT ") :])
    # the public address, checked, is reached through the guard: the listing works
    assert out["public"] == 0 and len(out["seen"]["8.8.8.8"]) >= 1, out
    # the rebound name: refused, with the reason, and loopback never got a connection
    assert out["rebound"] != "listed" and "127.0.0.1" in out["rebound"], out
    assert "allow_endpoints" in out["rebound"], out
    assert out["seen"]["127.0.0.1"] == [], out
