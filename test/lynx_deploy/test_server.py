"""Ports for test servers: picked where no other process takes them, and a taken one is replaced.
A server slot runs one server at a time."""

from __future__ import annotations

import sys
import urllib.request

import pytest

from lynx_deploy import processes
from lynx_deploy.processes import free_port
from lynx_deploy.server import PORT_ATTEMPTS, PortTaken, ServerStartError, SGLangServer, ServerSlot

# A stand-in for launch_server: its first `--faulty-starts` starts fail as `--fault` says, then it
# serves /v1/models. ``http``: it reports (as uvicorn does) that its HTTP port was taken and hangs;
# ``dist``: it exits as a scheduler does whose torch.distributed port was taken.
FAKE_SERVER = r"""
import http.server, pathlib, sys, time
def arg(name):
    return sys.argv[sys.argv.index(name) + 1]
port, marks, fault = int(arg("--port")), pathlib.Path(arg("--marks")), arg("--fault")
faulty = int(marks.read_text() or 0) if marks.exists() else 0
if faulty < int(arg("--faulty-starts")):
    marks.write_text(str(faulty + 1))
    if fault == "http":
        print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
              "address already in use", flush=True)
        time.sleep(600)
    print("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
          "address. port: 28768, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    sys.exit(1)
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
"""


def test_free_ports_are_below_the_ephemeral_range_bindable_and_never_handed_out_twice():
    low = processes._ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports) or low <= 2048


def _fake(tmp_path, faulty_starts: int, fault: str = "http") -> SGLangServer:
    server = SGLangServer(tmp_path, log_path=tmp_path / "server.log")
    port_at = server.command.index("--port")
    server.command = [sys.executable, "-c", FAKE_SERVER, *server.command[port_at : port_at + 2],
                      "--marks", str(tmp_path / "marks"), "--faulty-starts", str(faulty_starts),
                      "--fault", fault]  # fmt: skip
    return server


@pytest.mark.parametrize(
    "fault,logged", [("http", "error while attempting to bind"), ("dist", "EADDRINUSE")], ids=["http", "distributed"]
)
def test_a_server_whose_port_was_taken_starts_again_on_fresh_ports(tmp_path, fault, logged):
    server = _fake(tmp_path, faulty_starts=1, fault=fault)
    first = server.port
    with server:
        assert server.port != first
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=5) as resp:
            assert resp.status == 200
    assert (tmp_path / "server.log").read_text().count(logged) == 1


def test_a_port_taken_at_every_start_fails_fast_with_the_log(tmp_path):
    server = _fake(tmp_path, faulty_starts=PORT_ATTEMPTS)
    with pytest.raises(PortTaken, match="was taken by another process"):
        server.start().wait_ready(timeout=60)
    assert server.process is not None and server.process.poll() is None  # hung, as uvicorn does
    server.stop()


class _Started:
    """A stand-in server: `__enter__` starts it (or fails, as a server that never gets ready)."""

    def __init__(self, name: str, log: list, ready: bool = True) -> None:
        self.url, self._log, self._ready = f"http://{name}", log, ready

    def __enter__(self):
        self._log.append(("start", self.url))
        if not self._ready:
            raise ServerStartError("not ready")
        return self

    def stop(self) -> None:
        self._log.append(("stop", self.url))


def test_a_server_slot_keeps_one_server_per_key_and_stops_the_last_on_close():
    log = []
    with ServerSlot() as slot:
        assert slot.serve("a", lambda: _Started("a", log)) == "http://a"
        assert slot.serve("a", lambda: _Started("a-again", log)) == "http://a"  # still running: not restarted
        assert slot.serve("b", lambda: _Started("b", log)) == "http://b"
    assert log == [("start", "http://a"), ("stop", "http://a"), ("start", "http://b"), ("stop", "http://b")]


def test_a_server_slot_tries_again_after_a_server_that_never_got_ready():
    log, slot = [], ServerSlot()
    with pytest.raises(ServerStartError):
        slot.serve("a", lambda: _Started("a", log, ready=False))
    assert slot.serve("a", lambda: _Started("a2", log)) == "http://a2"
    slot.close()
    assert log == [("start", "http://a"), ("start", "http://a2"), ("stop", "http://a2")]


def test_a_servers_stacks_go_to_its_log_with_the_reason(tmp_path):
    """What a deployment leaving on an error leaves for the reader: each process's Python stacks."""
    with _fake(tmp_path, faulty_starts=0) as server:
        server.dump_stacks("the request timed out")
    log = (tmp_path / "server.log").read_text()
    assert "Python stacks at" in log and "the request timed out" in log
    assert "serve_forever" in log, log[-2000:]
