"""The probe's parts without a server: the fit, each engine's request and reading, the canaries file, the CLI's
usage rules."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.probe.canaries import Canaries, Canary, Position, load, save, scale_grid
from adapterdoc.probe.conventions import CONVENTIONS, Alignment, Ask
from adapterdoc.probe.fit import Observation, fit

SCALES = scale_grid(4)


def _curve(s: float, i: int) -> float:
    """A non-linear expected logprob at scale ``s`` for observation ``i``."""
    return -4.0 - 0.3 * math.sin(i) * s - 0.05 * s * s * math.cos(i)


def _obs(served_scale: float | None, n: int = 20, noise: float = 0.0) -> list[Observation]:
    return [
        Observation(
            (_curve(served_scale, i) if served_scale is not None else -3.0 + 0.2 * math.cos(3 * i)) + noise,
            [_curve(s, i) for s in SCALES],
        )
        for i in range(n)
    ]


def test_the_scale_grid() -> None:
    assert scale_grid(4) == (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
    assert scale_grid(16)[-1] == 4.0 and 0.25 in scale_grid(16)
    assert set(scale_grid(8)) >= {0.0, 0.5, 1 / math.sqrt(8), 1.0, 2.0, math.sqrt(8)}


@pytest.mark.parametrize(
    ("served", "verdict", "factor"),
    [
        (1.0, "applied", 1.0),
        (0.0, "base", 0.0),
        (0.5, "scale", 0.5),
        (2.0, "scale", 2.0),
        (1.2, "scale", 1.2),
    ],
)
def test_the_verdict(served: float, verdict: str, factor: float) -> None:
    result = fit(_obs(served, noise=1e-4), SCALES, "float32")
    assert result.verdict == verdict
    assert result.factor is not None and abs(result.factor - factor) <= 0.05 * max(factor, 0.1)


def test_something_else_fits_nothing() -> None:
    result = fit(_obs(None), SCALES, "float32")
    assert (result.verdict, result.factor) == ("differs", None)


def test_the_tolerance_follows_the_dtype() -> None:
    # 0.02 off the adapter: outside float32's tolerance, inside bfloat16's
    assert fit(_obs(1.0, noise=0.02), SCALES, "bfloat16").verdict == "applied"
    assert fit(_obs(1.0, noise=0.02), SCALES, "float32").verdict != "applied"


CANARY = Canary(
    "w1 w2 w3",
    [5, 6, 7],
    [Position(1, 6, [-1.0] * 7), Position(2, 7, [-2.0] * 7)],
    {9: [-0.5] * 7, 11: [-3.0] * 7},
)


def test_each_engine_sends_the_users_name_in_its_own_field() -> None:
    ask = Ask("my-adapter", "base-model", {"user": "ci"})
    vllm = CONVENTIONS["vllm"].build(ask, CANARY)
    assert (vllm["model"], vllm["prompt"], vllm["prompt_logprobs"], vllm["user"]) == (
        "my-adapter",
        [5, 6, 7],
        1,
        "ci",
    )
    sglang = CONVENTIONS["sglang"].build(ask, CANARY)
    assert (sglang["model"], sglang["lora_path"], sglang["echo"]) == ("base-model", "my-adapter", True)
    assert CONVENTIONS["sglang"].build(Ask("base:my-adapter"), CANARY)["model"] == "base:my-adapter"
    assert "lora_path" not in CONVENTIONS["sglang"].build(Ask("my-adapter"), CANARY)
    llama = CONVENTIONS["llama.cpp"].build(ask, CANARY)
    assert (llama["model"], llama["prompt"], llama["echo"], llama["logprobs"]) == (
        "my-adapter",
        "w1 w2 w3",
        True,
        1,
    )
    mlx = CONVENTIONS["mlx-lm"].build(ask, CANARY)
    assert (mlx["adapters"], mlx["model"], mlx["logprobs"], mlx["top_logprobs"]) == (
        "my-adapter",
        "base-model",
        True,
        11,
    )
    assert "model" not in CONVENTIONS["mlx-lm"].build(Ask("/srv/a"), CANARY)  # never filled in


def test_each_engine_answer_is_read() -> None:
    vllm = {
        "choices": [{"prompt_logprobs": [None, {"6": {"logprob": -1.1}}, {"7": {"logprob": -2.1}, "8": {}}]}]
    }
    assert [o.served for o in CONVENTIONS["vllm"].read(vllm, CANARY, Alignment())] == [-1.1, -2.1]
    echo = {"choices": [{"logprobs": {"token_logprobs": [None, -1.2, -2.2]}}]}
    assert [o.served for o in CONVENTIONS["llama.cpp"].read(echo, CANARY, Alignment())] == [-1.2, -2.2]
    assert [o.served for o in CONVENTIONS["llama.cpp"].read(echo, CANARY, Alignment(-1))] == [
        -1.2
    ]  # pos 2 at 1
    # llama-cpp-python without BOS: the value at a position's own index, against its `same` values
    same = Canary(
        CANARY.text, CANARY.ids, [Position(1, 6, [-1.0] * 7, [-4.0] * 7), Position(2, 7, [-2.0] * 7)]
    )
    got = CONVENTIONS["llama.cpp"].read(echo, same, Alignment(0, same=True))
    assert [(o.served, o.expected[0]) for o in got] == [(-1.2, -4.0)]  # a position without same values: none
    top = [{"id": 9, "logprob": -0.6}, {"id": 10, "logprob": -0.9}, {"id": 11, "logprob": -3.1}]
    mlx = {"choices": [{"logprobs": {"content": [{"id": 9, "top_logprobs": top}]}}]}
    assert [(o.served, o.expected[0]) for o in CONVENTIONS["mlx-lm"].read(mlx, CANARY, Alignment())] == [
        (-0.6, -0.5),
        (-3.1, -3.0),
    ]
    assert CONVENTIONS["vllm"].read({"error": "x"}, CANARY, Alignment()) == []


def test_the_engine_choices_are_the_conventions() -> None:
    from adapterdoc.commands.probe_cmd import ENGINES

    assert tuple(CONVENTIONS) == ENGINES


def test_the_canaries_file_round_trips(tmp_path: Path) -> None:
    c = Canaries("a", "b", 4, "float32", list(SCALES), [CANARY], bos=True)
    save(c, tmp_path / "c.json")
    assert load(tmp_path / "c.json") == c
    raw = json.loads((tmp_path / "c.json").read_text())
    assert raw["version"] == 1
    (tmp_path / "v2.json").write_text(json.dumps({**raw, "version": 2}))
    with pytest.raises(Exception, match="version 2"):
        load(tmp_path / "v2.json")


def test_usage(cli: Any, tmp_path: Path) -> None:
    assert cli("probe", "http://127.0.0.1:9").exit_code == 2  # no --adapter
    assert cli("probe", "http://127.0.0.1:9", "--adapter", "a").exit_code == 2  # no canaries
    r = cli("probe", "http://127.0.0.1:9", "--adapter", "a", "--canaries", tmp_path / "none.json")
    assert r.exit_code == 3 and "canaries" in r.stderr
    assert cli("probe", "--make-canaries", "x", "--base", "y").exit_code == 2  # no --out


def test_the_api_key_is_never_printed(cli: Any, stubs: Any, tmp_path: Path) -> None:
    """A server whose error echoes the Authorization header it got: the line shows *** where the key was."""
    from tests.probe.stub_server import echo_key, send, url

    c = Canaries("a", "b", 4, "float32", list(SCALES), [CANARY])
    save(c, tmp_path / "c.json")
    server = stubs(send(200, {"data": [{"id": "a", "owned_by": "vllm"}]}), echo_key(400))
    args = ["probe", url(server), "--adapter", "a", "--canaries", tmp_path / "c.json"]
    r = cli(*args, "--api-key-env", "PROBE_KEY", env={"PROBE_KEY": "sekret-123"})
    assert r.exit_code == 3 and "Bearer ***" in r.stderr and "sekret" not in r.stdout + r.stderr, r.output
    r = cli(*args, "--api-key-env", "PROBE_UNSET_KEY")
    assert r.exit_code == 3 and "PROBE_UNSET_KEY" in r.stderr


def test_the_probe_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, adapterdoc.probe.run, adapterdoc.commands.probe_cmd; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "github", "sarif"])
def test_every_format_renders_the_report(fmt: str) -> None:
    from adapterdoc.report.findings import make
    from adapterdoc.report.formats import render
    from adapterdoc.report.probe_report import ProbeReport

    report = ProbeReport(
        url="http://127.0.0.1:8000",
        engine="vllm",
        engine_detected=False,
        request="model='a'",
        verdict="scale",
        factor=0.5,
        dtype="bfloat16",
        observations=40,
        separation=50.0,
        best=0.3,
        deviation={0.0: 50.0, 1.0: 20.0},
        findings=[make("AD902", "the adapter is applied at 0.5× PEFT's scaling", key="a")],
    )
    text = render(report, fmt)
    assert "AD902" in text
    if fmt == "text":
        assert "0.5× PEFT's scaling" in text
    if fmt == "json":
        assert json.loads(text)["deviation"] == {"0.0": 50.0, "1.0": 20.0}


def test_a_canaries_file_without_the_base_scale_is_refused(tmp_path: Path) -> None:
    c = Canaries("a", "b", 4, "float32", [0.5, 1.0], [Canary("t", [1, 2], [Position(1, 2, [-1.0, -2.0])])])
    save(c, tmp_path / "c.json")
    with pytest.raises(Exception, match="scales must hold 0"):
        load(tmp_path / "c.json")
    c = Canaries("a", "b", 4, "float32", [0.0, 1.0], [Canary("t", [1, 2], [Position(1, 2, [-1.0])])])
    save(c, tmp_path / "d.json")
    with pytest.raises(Exception, match="one per scale"):
        load(tmp_path / "d.json")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9/$(touch x)", "space or a control character"),
        ("http://a b", "space or a control character"),
        ("http://:80", "names no host"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:abc", "Port could not be cast"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("ftp://127.0.0.1", "must start with http"),
    ],
)
def test_a_url_that_is_no_url_is_one_line(cli: Any, tmp_path: Path, url: str, why: str) -> None:
    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), tmp_path / "c.json")
    r = cli("probe", url, "--adapter", "a", "--canaries", tmp_path / "c.json")
    assert r.exit_code == 3 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_server_that_answers_no_http_is_one_line(cli: Any, tmp_path: Path) -> None:
    """A listener that answers bytes that are no HTTP (http.client's BadStatusLine): exit 3, not a traceback."""
    import socket
    import threading

    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), tmp_path / "c.json")
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        r = cli("probe", url, "--adapter", "a", "--canaries", tmp_path / "c.json")
    finally:
        thread.join(5)
        listener.close()
    assert r.exit_code == 3 and "no HTTP answer" in r.stderr, r.stderr


def test_a_404_for_the_adapter_names_the_request_that_loads_it(cli: Any, tmp_path: Path) -> None:
    """vLLM answers 404 for a model name it does not serve (its ErrorResponse body, as vLLM 0.1x writes it): exit 3,
    the line says what was sent and how the adapter is loaded under that name."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply(200, {"object": "list", "data": [{"id": "base", "owned_by": "vllm", "root": "base"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            message = "The model `customer-a` does not exist."
            self._reply(404, {"error": {"message": message, "type": "NotFoundError", "code": 404}})

        def log_message(self, *args: Any) -> None:
            pass

    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), tmp_path / "c.json")
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = cli("probe", url, "--adapter", "customer-a", "--canaries", tmp_path / "c.json")
    finally:
        server.shutdown()
        server.server_close()
    assert r.exit_code == 3, r.output
    assert "HTTP 404 for model='customer-a': The model `customer-a` does not exist." in r.stderr
    assert "--lora-modules customer-a=PATH" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_canaries_file_that_cannot_be_read_is_one_line(cli: Any) -> None:
    """A path that is a file but whose read fails (here /proc/self/mem, an I/O error at offset 0, even for root)."""
    r = cli("probe", "http://127.0.0.1:9", "--adapter", "a", "--canaries", "/proc/self/mem")
    assert r.exit_code == 3 and "cannot read it" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_scale_hint_names_what_makes_that_factor() -> None:
    from adapterdoc.probe.run import scale_hint

    rslora = scale_hint(0.125, 64, "sglang")  # SGLang ignores use_rslora: lora_alpha / r instead of / sqrt(r)
    assert (
        rslora.startswith("1/√r for r=64: if the adapter uses rsLoRA")
        and "remap ADAPTER --for sglang" in rslora
    )
    assert "lora_scale" in rslora  # 1/sqrt(r) may still be a server's scale: both are named
    assert "use_rslora false" in scale_hint(0.5, 4, "llama.cpp")
    other = scale_hint(0.6, 16, "vllm")
    assert not other.startswith("1/√r") and "--lora-target-modules" in other and "lora_scale" in other


def test_a_server_that_tokenizes_otherwise_is_said(cli: Any, stubs: Any, tmp_path: Path) -> None:
    """llama.cpp echoing 9 tokens for a canary of 3 ids (the GGUF's tokenizer is not the base's): "differs" says so;
    with a count the canaries explain (3 + the generated one) nothing is said."""
    from tests.probe.stub_server import send, url

    moving = [Position(1, 6, [-2.0 - 0.5 * s for s in SCALES]), Position(2, 7, [-5.0 - s for s in SCALES])]
    save(
        Canaries("a", "b", 4, "float32", list(SCALES), [Canary("w1 w2 w3", [5, 6, 7], moving)]),
        tmp_path / "c.json",
    )
    models = send(200, {"data": [{"id": "a", "owned_by": "me"}]})
    words = "split canary 1's text into 9 tokens, the canaries' tokenizer into 3"
    for served, said in (
        ([None] + [-20.0 - i for i in range(8)], True),
        ([None, -20.0, -21.0, -22.0], False),
    ):
        answer = send(200, {"choices": [{"text": "x", "logprobs": {"token_logprobs": served}}]})
        r = cli(
            "probe", url(stubs(models, answer)), "--adapter", "a", "--canaries", tmp_path / "c.json", "--json"
        )
        out = json.loads(r.stdout)
        assert (r.exit_code, out["verdict"]) == (1, "differs"), r.output
        assert (words in out["findings"][-1]["message"]) == said, out["findings"]
