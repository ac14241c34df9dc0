"""aotpack-serve against Triton's own client (tritonclient[http]) and hostile raw HTTP: health,
metadata, inference (JSON and binary tensors) with eager parity, concurrency, error responses,
bounded connections, SIGTERM drain, pinned instance threads, an installed prefix."""
from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from aotpack.runtime import parity
from aotpack.runtime.native import CHECKOUT, find_server
from helpers import MODELS, SAMPLES, eager_outputs
from test_core_partitions import CORES, pinned

tritonclient = pytest.importorskip("tritonclient.http")  # the `test` extra


MODEL_FILES = {"mlp": SAMPLES / "mlp.py", "transformer_block": SAMPLES / "transformer_block.py",
               "sort_rows": MODELS / "parallel_extern.py"}
INSTANCES = min(2, len(CORES))


@pytest.fixture(scope="module")
def archives(build_model) -> dict[str, Path]:
    return {name: build_model(path).archive for name, path in MODEL_FILES.items()}


def make_repository(root: Path, archives: dict[str, Path], broken: bool = True) -> Path:
    """MODEL_DIR/<name>/1/<archive>, plus (broken) a model whose archive is junk."""
    for name, archive in archives.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copy(archive, root / name / "1" / archive.name)
    if broken:
        (root / "broken" / "1").mkdir(parents=True)
        (root / "broken" / "1" / "junk.aotpack").write_bytes(b"not an archive")
    return root


class Server:
    """A running aotpack-serve on a free port; its stderr goes to a file."""

    started: list[Server] = []  # every one, so a failed test leaves none running

    def __init__(self, repository: Path, *args: str, binary: Path | None = None, env: dict | None = None):
        self.log = repository.with_name(repository.name + ".log")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([binary or find_server(), repository, "--port", "0", *args],
                                            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        Server.started.append(self)
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        assert line.startswith("port="), f"no port line: {line!r}\n{self.log.read_text()}"
        self.port = int(line.removeprefix("port="))
        self.url = f"localhost:{self.port}"

    def client(self):
        return tritonclient.InferenceServerClient(self.url, network_timeout=30)

    def request(self, method: str, path: str, body: bytes | str = b"", headers: dict | None = None):
        """(status, parsed JSON body) of one raw request."""
        connection = http.client.HTTPConnection("localhost", self.port, timeout=30)
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        connection.close()
        return response.status, json.loads(data) if data else None

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture(autouse=True)
def no_server_left_running():
    """Kills the servers a test started and did not stop (it failed first)."""
    before = len(Server.started)
    yield
    for left in Server.started[before:]:
        if left.process.poll() is None:
            left.process.kill()
            left.process.wait()


@pytest.fixture(scope="module")
def server(archives, tmp_path_factory):
    repository = make_repository(tmp_path_factory.mktemp("serve") / "models", archives)
    running = Server(repository, "--instances", str(INSTANCES), "--cores-per-instance", "1",
                     "--timeout-s", "2", "--max-body-mb", "8")
    yield running
    assert running.stop() == 0, running.log.read_text()


def infer_input(name: str, array: np.ndarray, binary: bool):
    tensor = tritonclient.InferInput(name, list(array.shape), {np.float32: "FP32"}[array.dtype.type])
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_health_and_metadata(server):
    client = server.client()
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict, as Triton: the broken model is not ready
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("broken")
    assert client.get_server_metadata() == {"name": "aotpack-serve", "version": "0.1.0",
                                            "extensions": ["binary_tensor_data"]}
    assert client.get_model_metadata("mlp") == {
        "name": "mlp", "versions": ["1"], "platform": "aotpack",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [32, 512]}],
        "outputs": [{"name": "output_0", "datatype": "FP32", "shape": [32, 512]}]}
    assert server.request("GET", "/v2/models/broken/versions/1") == (
        503, {"error": "model 'broken' version 1 is not ready: cannot load "
                       f"'{server.log.with_name('models')}/broken/1/junk.aotpack': not zstd-compressed "
                       "(an .aotpack archive is a zstd-compressed tar)"})


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("name", ["mlp", "transformer_block"])
def test_infer_matches_eager(server, name, binary):
    reference, inputs = eager_outputs(MODEL_FILES[name])
    client = server.client()
    output = tritonclient.InferRequestedOutput("output_0", binary_data=binary)
    result = client.infer(name, [infer_input("x", inputs[0].numpy(), binary)], outputs=[output],
                          request_id=f"req-{name}")
    response = result.get_response()
    assert (response["id"], response["model_name"], response["model_version"]) == (f"req-{name}", name, "1")
    assert ("parameters" in response["outputs"][0]) == binary  # binary_data_size, else "data"
    import torch

    check = parity.compare([torch.from_numpy(result.as_numpy("output_0").copy())], reference)
    assert check.ok, check.problems


def test_concurrent_clients(server):
    reference, inputs = eager_outputs(MODEL_FILES["mlp"])
    x = inputs[0].numpy()
    failures = []

    def client_loop():
        client = server.client()
        for _ in range(10):
            y = client.infer("mlp", [infer_input("x", x, True)]).as_numpy("output_0")
            if not np.array_equal(y, first):
                failures.append("outputs differ between requests")

    first = server.client().infer("mlp", [infer_input("x", x, True)]).as_numpy("output_0")
    threads = [threading.Thread(target=client_loop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    metrics = _metrics(server)
    assert 'aotpack_inference_requests_total{model="mlp",version="1"}' in metrics
    count = _metric(metrics, 'aotpack_inference_compute_seconds_count{model="mlp",version="1"}')
    assert count >= 81  # every run timed, the earlier tests' too


def _metrics(server) -> str:
    connection = http.client.HTTPConnection("localhost", server.port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/plain")
    return response.read().decode()


def _metric(text: str, series: str) -> float:
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(series + " ")))


def _infer_body(shape=(32, 512), name="x", datatype="FP32", data=None, **extra) -> str:
    tensor = {"name": name, "datatype": datatype, "shape": list(shape)}
    if data is not None:
        tensor["data"] = data
    tensor.update(extra)
    return json.dumps({"inputs": [tensor]})


def test_hostile_requests_get_protocol_errors(server):
    zeros = [0.0] * (32 * 512)
    header = _infer_body(parameters={"binary_data_size": 65536})
    cases = [
        ("/v2/models/mlp/infer", "{bad", {}, 400,
         "malformed JSON in the inference request: parse error at line 1, column 2: syntax error while "
         "parsing object key - invalid literal; last read: '{b'; expected string literal"),
        ("/v2/models/mlp/infer", "[1, 2]", {}, 400, "the inference request must be a JSON object, got an array"),
        ("/v2/models/mlp/infer", "{}", {}, 400, "the inference request has no 'inputs'"),
        ("/v2/models/mlp/infer", _infer_body(name="y", data=zeros), {}, 400,
         "unexpected inference input 'y' for model 'mlp'; its inputs are: x"),
        ("/v2/models/mlp/infer", _infer_body(datatype="FP64", data=zeros), {}, 400,
         "input 'x': the model takes FP32, the request says FP64"),
        ("/v2/models/mlp/infer", _infer_body(shape=(32, 511), data=zeros), {}, 400,
         "input 'x': the model takes shape [32, 512], the request says [32, 511]"),
        ("/v2/models/mlp/infer", _infer_body(data=[1.0, 2.0]), {}, 400,
         "input 'x': 'data' has 2 values, the shape needs 16384"),
        ("/v2/models/mlp/infer", _infer_body(data=["a"] * 16384), {}, 400,
         "input 'x': element 0 of 'data' is a string, expected a number for FP32"),
        ("/v2/models/mlp/infer", _infer_body(parameters={"binary_data_size": 100}), {}, 400,
         "input 'x': binary_data_size is 100 bytes, FP32[32, 512] takes 65536"),
        ("/v2/models/mlp/infer", header.encode() + bytes(1000),
         {"Inference-Header-Content-Length": str(len(header))}, 400,
         "input 'x': the body ends 64536 bytes short of its binary data"),
        ("/v2/models/mlp/infer", header.encode() + bytes(65540),
         {"Inference-Header-Content-Length": str(len(header))}, 400,
         "the request body has 4 bytes after the JSON header and the binary inputs it announces"),
        ("/v2/models/mlp/infer", "{}", {"Inference-Header-Content-Length": "99"}, 400,
         "Inference-Header-Content-Length is 99 but the body has only 2 bytes"),
        ("/v2/models/mlp/infer", "{}", {"Inference-Header-Content-Length": "-1"}, 400,
         "Inference-Header-Content-Length must be a whole number of bytes, got '-1'"),
        ("/v2/models/mlp/infer", json.dumps({"inputs": [], "outputs": [{"name": "nope"}]}), {}, 400,
         "model 'mlp' expects input 'x', the request has none"),
        ("/v2/models/mlp/infer", json.dumps({"inputs": json.loads(_infer_body(data=zeros))["inputs"],
                                             "outputs": [{"name": "nope"}]}), {}, 400,
         "unexpected inference output 'nope' for model 'mlp'; its outputs are: output_0"),
        ("/v2/models/mlp/infer", bytes(9 << 20), {}, 413, "the request body is larger than 8 MiB (--max-body-mb)"),
        ("/v2/models/nope/infer", "{}", {}, 404, "unknown model 'nope'"),
        ("/v2/models/mlp/versions/7/infer", "{}", {}, 404, "model 'mlp' has no version '7' (it has 1)"),
        ("/v2/models/mlp/versions/7/ready", "", {}, 404, "model 'mlp' has no version '7' (it has 1)"),
        ("/v2/nope", "", {}, 404, "no such endpoint: GET /v2/nope"),
    ]
    series = 'aotpack_inference_failures_total{model="mlp",version="1"}'
    failures = _metric(_metrics(server), series)
    for path, body, headers, status, message in cases:
        method = "GET" if path.endswith(("ready", "nope")) else "POST"
        assert server.request(method, path, body, headers) == (status, {"error": message}), path
    # Every 400 of an mlp inference is counted (the 413 never reaches the model's handler).
    counted = sum(path == "/v2/models/mlp/infer" and status == 400 for path, _, _, status, _ in cases)
    assert _metric(_metrics(server), series) == failures + counted
    status, reply = server.request("POST", "/v2/models/broken/infer", "{}")
    assert status == 503 and reply["error"].startswith("model 'broken' version 1 is not ready: cannot load")
    assert server.client().is_server_live()  # none of it took the server down


def test_slow_and_half_closed_connections(server):
    slow = socket.create_connection(("localhost", server.port))
    slow.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    start = time.monotonic()
    half = socket.create_connection(("localhost", server.port))
    half.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    half.shutdown(socket.SHUT_WR)  # half-closed mid-body: the server hangs up at once
    half.settimeout(10)
    assert half.recv(4096) == b""
    assert time.monotonic() - start < 1.0
    assert server.client().is_server_live()  # served while the slow client stalls
    slow.settimeout(10)
    data = slow.recv(4096)  # the read timeout (--timeout-s 2) ends the stalled request
    waited = time.monotonic() - start
    assert data == b"" or data.startswith(b"HTTP/1.1 400"), data
    assert 1.5 < waited < 8.0
    slow.close()
    half.close()


def test_instances_run_on_their_own_cores(server):
    if INSTANCES < 2:
        pytest.skip("needs 2 cores to partition")
    _, inputs = eager_outputs(MODEL_FILES["sort_rows"])
    server.client().infer("sort_rows", [infer_input("x", inputs[0].numpy(), True)])
    # One runner thread per instance per ready model (3 models x 2 instances), no more:
    # ATen's sort ran on one thread of its partition.
    assert pinned(server.process.pid) == Counter({str(CORES[0]): 3, str(CORES[1]): 3})


def test_sigterm_drains_in_flight_requests(archives, tmp_path):
    repository = make_repository(tmp_path / "models", {"transformer_block": archives["transformer_block"]},
                                 broken=False)
    server = Server(repository, "--instances", "1", "--timeout-s", "2")
    _, inputs = eager_outputs(MODEL_FILES["transformer_block"])
    x = inputs[0].numpy()
    expected = server.client().infer("transformer_block", [infer_input("x", x, True)]).as_numpy("output_0")
    outcomes, done = Counter(), threading.Event()

    def client_loop():
        client = server.client()
        while not done.is_set():
            try:
                y = client.infer("transformer_block", [infer_input("x", x, True)]).as_numpy("output_0")
                outcomes["ok" if np.array_equal(y, expected) else "wrong"] += 1
            except tritonclient.InferenceServerException as e:
                outcomes[f"{e.status()} {e.message()}"] += 1
            except Exception:  # noqa: BLE001 - the connection closed after the drain
                outcomes["disconnected"] += 1
                return

    threads = [threading.Thread(target=client_loop) for _ in range(4)]
    for t in threads:
        t.start()
    while outcomes["ok"] < 4:
        time.sleep(0.01)
    status = server.stop()
    done.set()
    for t in threads:
        t.join()
    log = server.log.read_text()
    assert status == 0, log
    assert "aotpack-serve: stopped (0 request(s) still in flight)" in log
    in_flight = int(log.split("draining ")[1].split(" ")[0])
    assert in_flight >= 1  # four clients never stop sending
    assert set(outcomes) <= {"ok", "503 the server is shutting down", "disconnected"}, outcomes


def test_sigterm_during_the_load_stops_cleanly(archives, tmp_path):
    repository = make_repository(tmp_path / "models", archives, broken=False)
    process = subprocess.Popen([find_server(), repository, "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    blocked = 0
    while not blocked & (1 << (signal.SIGTERM - 1)):  # the server has blocked SIGTERM: it is in main()
        status = Path(f"/proc/{process.pid}/status").read_text()
        blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    process.send_signal(signal.SIGTERM)  # pending while the models load, taken once it listens
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # the bug: httplib's stop() before listen() did nothing
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, err
    assert err.endswith("aotpack-serve: signal 15: draining 0 in-flight request(s)\n"
                        "aotpack-serve: stopped (0 request(s) still in flight)\n")


def test_a_full_queue_answers_503(archives, tmp_path):
    repository = make_repository(tmp_path / "models", {"transformer_block": archives["transformer_block"]},
                                 broken=False)
    server = Server(repository, "--instances", "1", "--max-queue", "1")
    _, inputs = eager_outputs(MODEL_FILES["transformer_block"])
    x = inputs[0].numpy()
    outcomes, start = Counter(), threading.Barrier(8)

    def one_request():
        client = server.client()
        start.wait()  # eight at once: one runs, one waits, the rest find the queue full
        try:
            client.infer("transformer_block", [infer_input("x", x, True)])
            outcomes["ok"] += 1
        except tritonclient.InferenceServerException as e:
            outcomes[f"{e.status()} {e.message()}"] += 1

    threads = [threading.Thread(target=one_request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    full = ("503 model 'transformer_block' version 1: 1 request(s) already waiting (--max-queue 1); "
            "retry later")
    assert set(outcomes) == {"ok", full} and outcomes["ok"] >= 2, outcomes
    assert server.stop() == 0


def test_bounded_connections_answer_503(archives, tmp_path):
    repository = make_repository(tmp_path / "models", {"mlp": archives["mlp"]}, broken=False)
    server = Server(repository, "--http-threads", "2", "--max-connections", "2", "--timeout-s", "5")
    # Two idle connections hold the two threads, two more wait: they are accepted first (the
    # listen queue is FIFO), so the next connection is answered 503 at once.
    idle = [socket.create_connection(("localhost", server.port)) for _ in range(4)]
    assert server.request("GET", "/v2/health/live") == (
        503, {"error": "the server is busy: 2 connections are being served and 2 wait "
                       "(--http-threads, --max-connections); retry later"})
    for s in idle:
        s.close()
    assert server.stop() == 0


def test_installed_prefix_serves_without_python(archives, tmp_path):
    build = CHECKOUT / "native" / "build"
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True, capture_output=True)
    binary = prefix / "bin" / "aotpack-serve"
    env = {"PATH": str(prefix / "bin"), "HOME": str(tmp_path)}  # no python on PATH
    assert shutil.which("python3", path=env["PATH"]) is None
    repository = make_repository(tmp_path / "models", {"mlp": archives["mlp"]}, broken=False)
    server = Server(repository, binary=binary, env=env)
    reference, inputs = eager_outputs(MODEL_FILES["mlp"])
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [32, 512],
                                   "data": inputs[0].flatten().tolist()}]})
    status, reply = server.request("POST", "/v2/models/mlp/infer", body)
    assert status == 200, reply
    import torch

    y = torch.tensor(reply["outputs"][0]["data"], dtype=torch.float32).reshape(32, 512)
    check = parity.compare([y], reference)
    assert check.ok, check.problems
    assert server.stop() == 0


def test_aotpack_serve_launches_the_binary(tmp_path):
    import sys

    cli = [sys.executable, "-m", "aotpack.commands.cli", "serve"]
    done = subprocess.run([*cli, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: aotpack-serve MODEL_DIR")
    done = subprocess.run([*cli, tmp_path], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AOTPACK_SERVE": str(tmp_path / "nope")})
    assert (done.returncode, done.stderr) == (
        1, f"aotpack: error: AOTPACK_SERVE={tmp_path / 'nope'} is not an executable file; point it at "
           "aotpack-serve or unset it\n")
    done = subprocess.run([*cli, tmp_path / "missing", "--port", "0"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (1, f"aotpack-serve: error: MODEL_DIR '{tmp_path / 'missing'}' "
                                                 "is not a folder\n")
