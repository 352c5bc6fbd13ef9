"""The probe against broken and hostile servers, canaries files and options: each is one line on stderr and exit 3
(never a traceback, never exit 4), and nothing is written. The server is a loopback stub from the standard library
that answers what such a server would; the thing under test is adapterdoc's client and readers, not an engine."""

from __future__ import annotations

import http.server
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.probe.canaries import Canaries, Canary, Position, save, scale_grid
from tests.probe.stub_server import Reply, Stub, echo_key, send, url

SCALES = scale_grid(4)
POSITIONS = [(1, 6), (2, 7), (3, 8)]


def _expected(i: int, s: float) -> float:
    """Position ``i``'s logprob at scale ``s``: positions far apart, so that a list read one position off fits
    nothing (as a real model's)."""
    return -2.0 - 3.0 * i - 0.5 * (i + 1) * s


CANARY = Canary(
    "w1 w2 w3 w4",
    [5, 6, 7, 8],
    [Position(pos, token, [_expected(i, s) for s in SCALES]) for i, (pos, token) in enumerate(POSITIONS)],
    {9: [_expected(3, s) for s in SCALES]},
)
VLLM_MODELS = {
    "object": "list",
    "data": [{"id": "base", "owned_by": "vllm"}, {"id": "a", "owned_by": "vllm"}],
}
MLX_MODELS = {"object": "list", "data": [{"id": "base", "created": 1}]}


def _vllm_answer(scale: float = 1.0) -> dict[str, object]:
    rows: list[object] = [None] * 4
    for i, (pos, token) in enumerate(POSITIONS):
        rows[pos] = {str(token): {"logprob": _expected(i, scale)}}
    return {"choices": [{"text": "x", "prompt_logprobs": rows}]}


def _echo_answer(values: list[object]) -> dict[str, object]:
    return {"choices": [{"text": "x", "logprobs": {"token_logprobs": values}}]}


@pytest.fixture
def stub(stubs: Callable[[Reply, Reply], Stub]) -> Callable[..., Stub]:
    """``stub(get=..., post=...)``: a loopback server answering GET and POST with these replies."""

    def run(get: Reply = send(200, VLLM_MODELS), post: Reply = send(200, _vllm_answer())) -> Stub:
        return stubs(get, post)

    return run


@pytest.fixture
def canaries(tmp_path: Path) -> Path:
    path = tmp_path / "c.json"
    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), path)
    return path


def one_line(r: Any, *words: str, code: int = 3) -> None:
    """Exit ``code``, one ``adapterdoc: error:`` line holding ``words``, no traceback, nothing on stdout."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == code and len(lines) == 1 and lines[0].startswith("adapterdoc: error: "), r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    assert r.stdout == ""


def test_the_stub_answers_a_verdict(cli: Any, stub: Any, canaries: Path) -> None:
    """The stub itself: a well-formed answer at scale 1 is "applied", at scale 0 "base", at ½ the factor."""
    assert cli("probe", url(stub()), "--adapter", "a", "--canaries", canaries).exit_code == 0
    r = cli("probe", url(stub(post=send(200, _vllm_answer(0.0)))), "--adapter", "a", "--canaries", canaries)
    assert r.exit_code == 1 and "AD901" in r.stdout
    r = cli(
        "probe",
        url(stub(post=send(200, _vllm_answer(0.5)))),
        "--adapter",
        "a",
        "--canaries",
        canaries,
        "--json",
    )
    assert r.exit_code == 1 and abs(json.loads(r.stdout)["factor"] - 0.5) < 0.01


# ------------------------------------------------------------------------------------------- the server's answers


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"hello, not JSON", ["returned no JSON"]),
        (b"", ["returned no JSON"]),
        ([1, 2], ["returned no JSON object"]),
        ("a string", ["returned no JSON object"]),
        (None, ["returned no JSON object"]),
        ({"id": "x"}, ["no logprobs"]),
        ({"choices": []}, ["no logprobs"]),
        ({"choices": "all"}, ["no logprobs"]),
        ({"choices": [None]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": "x"}]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": "-1.0"}}]}]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": True}}]}]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": [[-1.0]]}}]}]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": [{"logprob": -1.0}]}]}]}, ["no logprobs"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": math.nan}}]}]}, ["nan as a logprob"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": math.inf}}]}]}, ["inf as a logprob"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": -math.inf}}]}]}, ["-inf as a logprob"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": 1e300}}]}]}, ["1e+300 as a logprob"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": 10**400}}]}]}, ["inf as a logprob"]),
        ({"choices": [{"prompt_logprobs": [None, {"6": {"logprob": 5.0}}]}]}, ["5.0 as a logprob"]),
        (b"[" * 100_000 + b"]" * 100_000, ["returned no JSON"]),
    ],
)
def test_a_broken_answer_is_one_line(
    cli: Any, stub: Any, canaries: Path, answer: object, words: list[str]
) -> None:
    server = stub(post=send(200, answer))
    one_line(cli("probe", url(server), "--adapter", "a", "--canaries", canaries), *words)


def test_token_logprobs_shorter_than_the_prompt_read_what_is_there(
    cli: Any, stub: Any, canaries: Path
) -> None:
    """llama.cpp's echo answer cut short: the positions it holds are read, the rest are not; none is one line."""
    models = send(200, {"data": [{"id": "a", "owned_by": "me"}]})
    short = [None, _expected(0, 1.0), _expected(1, 1.0)]  # position 3 missing
    r = cli(
        "probe",
        url(stub(get=models, post=send(200, _echo_answer(short)))),
        "--adapter",
        "a",
        "--canaries",
        canaries,
        "--json",
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["observations"] == 2, r.output
    r = cli(
        "probe",
        url(stub(get=models, post=send(200, _echo_answer([])))),
        "--adapter",
        "a",
        "--canaries",
        canaries,
    )
    one_line(r, "llama.cpp server returned no logprobs")


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (500, b"<html><body><h1>Internal Server Error</h1></body></html>", ["HTTP 500", "an HTML page"]),
        (502, b"Bad Gateway", ["HTTP 502", "Bad Gateway"]),
        (400, {"detail": [{"loc": ["body", "prompt"], "msg": "bad"}]}, ["HTTP 400", "bad"]),
    ],
)
def test_an_http_error_is_one_line(
    cli: Any, stub: Any, canaries: Path, status: int, body: object, words: list[str]
) -> None:
    one_line(
        cli("probe", url(stub(post=send(status, body))), "--adapter", "a", "--canaries", canaries), *words
    )


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("where", ["get", "post"])
def test_a_refused_api_key_names_the_option(
    cli: Any, stub: Any, canaries: Path, status: int, where: str
) -> None:
    refuse = echo_key(status)  # a server that shows what it was sent
    server = stub(**{where: refuse})
    args = ["probe", url(server), "--adapter", "a", "--canaries", canaries, "--engine", "vllm"]
    one_line(cli(*args), f"HTTP {status}", "wants an API key", "--api-key-env")
    r = cli(*args, "--api-key-env", "PROBE_KEY", env={"PROBE_KEY": "sekret-123"})
    one_line(r, f"HTTP {status}", "refuses the API key in PROBE_KEY")
    assert "sekret" not in r.stderr


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("where", ["get", "post"])
def test_a_redirect_is_refused_not_followed(
    cli: Any, stub: Any, canaries: Path, tmp_path: Path, code: int, where: str
) -> None:
    """urllib follows 301-308 for GET (and 301-303 for POST, as a GET), the Authorization header with it: the probe
    follows none, so the key never leaves for another host."""
    elsewhere = stub()
    to = url(elsewhere) + "/v1/models"
    server = stub(**{where: send(code, b"", {"Location": to})})
    out = tmp_path / "report.json"
    args = ["probe", url(server), "--adapter", "a", "--canaries", canaries, "--api-key-env", "PROBE_KEY"]
    r = cli(*args, "--output-file", out, env={"PROBE_KEY": "sekret-123"})
    one_line(r, f"HTTP {code}", f"redirects to {to}", "only the URL given")
    assert elsewhere.seen == [] and not out.exists()


def test_a_server_that_hangs_up_is_one_line(cli: Any, stub: Any, canaries: Path) -> None:
    def hang_up(h: Any) -> None:
        h.close_connection = True

    one_line(
        cli("probe", url(stub(post=hang_up)), "--adapter", "a", "--canaries", canaries), "connection failed"
    )


def test_escape_sequences_from_the_server_are_not_printed(cli: Any, stub: Any, canaries: Path) -> None:
    """A hostile server's error message or Location with a terminal escape sequence: shown as ``?``."""
    server = stub(post=send(500, {"error": {"message": "oops\x1b[2J\x1b]0;pwned\x07"}}))
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries)
    one_line(r, "HTTP 500", "oops?[2J?]0;pwned?")
    assert "\x1b" not in r.stderr
    server = stub(get=send(302, b"", {"Location": "http://evil\x1b[2J/"}))
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries)
    one_line(r, "redirects to http://evil?[2J/")


def test_a_huge_answer_is_cut_short(cli: Any, stub: Any, canaries: Path) -> None:
    """200 MB announced (and streamed as long as the client reads): the client stops at its cap."""
    size = 200 * 2**20

    def huge(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        block = b" " * 2**20
        try:
            for _ in range(200):
                h.wfile.write(block)
        except OSError:  # the client hung up
            pass

    started = time.monotonic()
    one_line(
        cli("probe", url(stub(post=huge)), "--adapter", "a", "--canaries", canaries), "larger than 8 MiB"
    )
    assert time.monotonic() - started < 20


def test_a_server_that_never_answers_times_out(cli: Any, stub: Any, canaries: Path) -> None:
    def silent(h: Any) -> None:
        h.server.stop.wait(30)

    started = time.monotonic()
    r = cli("probe", url(stub(get=silent)), "--adapter", "a", "--canaries", canaries, "--timeout", "1")
    one_line(r, "no whole answer within 1 s (--timeout)")
    assert time.monotonic() - started < 10


def test_a_dripping_answer_times_out(cli: Any, stub: Any, canaries: Path) -> None:
    """One byte every 0.2 s keeps each read within the socket's timeout: the whole answer has the time limit."""

    def drip(h: Any) -> None:
        body = json.dumps(_vllm_answer()).encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        try:
            for byte in body:
                if h.server.stop.wait(0.2):
                    return
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
        except OSError:
            pass

    started = time.monotonic()
    r = cli("probe", url(stub(post=drip)), "--adapter", "a", "--canaries", canaries, "--timeout", "1")
    one_line(r, "no whole answer within 1 s")
    assert time.monotonic() - started < 10


def test_a_chunked_answer_is_read(cli: Any, stub: Any, canaries: Path) -> None:
    def chunked(h: Any) -> None:
        body = json.dumps(_vllm_answer()).encode()
        h.protocol_version = "HTTP/1.1"
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()
        for i in range(0, len(body), 7):
            part = body[i : i + 7]
            h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")

    r = cli("probe", url(stub(post=chunked)), "--adapter", "a", "--canaries", canaries)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "models",
    [
        send(404, {"detail": "Not Found"}),
        send(200, b"garbage"),
        send(200, {"data": "x"}),
        send(200, {"data": [{"id": "a", "owned_by": "someone"}]}),
        send(500, b"<html></html>"),
    ],
)
def test_an_unknown_engine_asks_for_engine(cli: Any, stub: Any, canaries: Path, models: Reply) -> None:
    server = stub(get=models)
    one_line(cli("probe", url(server), "--adapter", "a", "--canaries", canaries), "give --engine")
    assert (
        cli("probe", url(server), "--adapter", "a", "--canaries", canaries, "--engine", "vllm").exit_code == 0
    )


def test_a_hostile_models_list_is_shown_short(cli: Any, stub: Any, canaries: Path) -> None:
    """llama.cpp's warning lists /v1/models' ids: at most five, printable, whatever the server lists."""
    ids = [{"id": f"m{i}\x1b[31m", "owned_by": "me"} for i in range(50_000)]
    short = [None, _expected(0, 1.0), _expected(1, 1.0), _expected(2, 1.0)]
    server = stub(get=send(200, {"data": ids}), post=send(200, _echo_answer(short)))
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries, env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "AD921" in r.stdout and "(50000 in all)" in r.stdout, r.output
    assert "\x1b" not in r.stdout and len(r.stdout) < 2000


def test_the_wrong_engine_given_says_so(cli: Any, stub: Any, canaries: Path) -> None:
    """--engine vllm against an mlx-shaped server: its answer has no prompt_logprobs; the line asks about --engine."""
    top = [{"id": 9, "logprob": _expected(3, 1.0)}]
    mlx = {"choices": [{"logprobs": {"content": [{"id": 9, "top_logprobs": top}]}}]}
    server = stub(get=send(200, MLX_MODELS), post=send(200, mlx))
    r = cli("probe", url(server), "--adapter", "a", "--base-model", "base", "--canaries", canaries)
    assert r.exit_code == 0, r.output  # detected: mlx-lm, its own reading
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries, "--engine", "vllm")
    one_line(r, "no logprobs", "--engine vllm was given: is the server vllm?")
    rejected = stub(get=send(200, MLX_MODELS), post=send(422, {"detail": "prompt must be a string"}))
    r = cli("probe", url(rejected), "--adapter", "a", "--canaries", canaries, "--engine", "sglang")
    one_line(r, "HTTP 422", "--engine sglang was given")


# --------------------------------------------------------------------------------------------- the canaries file


def _raw(**change: object) -> dict[str, object]:
    raw = Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]).to_dict()
    raw.update(change)
    return raw


def _canary(**change: object) -> dict[str, object]:
    raw = json.loads(json.dumps(_raw()))["canaries"][0]
    raw.update(change)
    return dict(raw)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ["not a canaries file"]),
        ("", ["not a canaries file"]),
        ("[1, 2]", ["not a canaries file"]),
        ("null", ["not a canaries file"]),
        ('"text"', ["not a canaries file"]),
        (_raw(version=99), ["version 99"]),
        (_raw(version="1"), ["version '1'"]),
        ({"version": 1}, ["not a canaries file"]),
        (_raw(canaries={"a": 1}), ["not a canaries file", "canaries are no list"]),
        (_raw(canaries=[]), ["holds no canaries"]),
        (_raw(canaries=[_canary(positions=[], next={})]), ["holds no canaries"]),
        (_raw(canaries=[_canary()] * 12), ["12 canaries; the probe sends at most 11"]),
        (
            _raw(canaries=[_canary(positions=[{"pos": "x", "token": 6, "logprobs": [0.0] * 7}])]),
            ["not a canaries"],
        ),
        (
            _raw(canaries=[_canary(positions=[{"pos": 1, "token": 6, "logprobs": "abcdefg"}])]),
            ["'a', not a number in [-1e+06, 1]"],
        ),
        (
            _raw(canaries=[_canary(positions=[{"pos": 1, "token": 6, "logprobs": [None] * 7}])]),
            ["None, not a number"],
        ),
        (
            _raw(canaries=[_canary(positions=[{"pos": 1, "token": 6, "logprobs": [math.nan] * 7}])]),
            ["nan, not a"],
        ),
        (_raw(canaries=[_canary(next={"9": [math.inf] * 7})]), ["inf, not a number"]),
        (
            _raw(
                canaries=[
                    _canary(
                        positions=[{"pos": 1, "token": 6, "logprobs": [-1.0] * 7, "same": [math.nan] * 7}]
                    )
                ]
            ),
            ["nan, not a number"],
        ),
        (_raw(canaries=[_canary(next={"x": [0.0] * 7})]), ["not a canaries file"]),
        (_raw(canaries=[_canary(next={"9": [-1e308] + [1e308] * 6})]), ["-1e+308, not a number"]),
        (
            _raw(canaries=[_canary(positions=[{"pos": 1, "token": 6, "logprobs": [-1.0] * 3}])]),
            ["one per scale"],
        ),
        (_raw(canaries=[_canary(ids="abc")]), ["not a canaries file"]),
        (_raw(scales=[0.25, 0.5]), ["scales must hold 0"]),
        (_raw(scales=[1.0, 0.0, 0.5, 0.25, 0.75, 1.5, 2.0]), ["not finite numbers in rising order"]),
        (_raw(scales=[0.0, 0.25, 0.5, 0.75, 1.0, 1.5, math.nan]), ["not finite numbers in rising order"]),
        (_raw(scales=[0.0, "x"]), ["not a canaries file"]),
        (_raw(scales="01"), ["not a canaries file", "scales are no list"]),
        ("[" * 100_000, ["not a canaries file", "nested too deep"]),
        (_raw(rank="four"), ["not a canaries file"]),
    ],
)
def test_a_hostile_canaries_file_is_one_line(
    cli: Any, stub: Any, tmp_path: Path, content: object, words: list[str]
) -> None:
    path = tmp_path / "c.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    server = stub()
    one_line(cli("probe", url(server), "--adapter", "a", "--canaries", path), *words)
    assert server.seen == []  # nothing sent for canaries that cannot be used


def test_a_folder_or_a_huge_file_as_canaries(cli: Any, stub: Any, tmp_path: Path) -> None:
    server = stub()
    (tmp_path / "dir.json").mkdir()
    one_line(cli("probe", url(server), "--adapter", "a", "--canaries", tmp_path / "dir.json"), "dir.json")
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(17 * 2**20)
    one_line(cli("probe", url(server), "--adapter", "a", "--canaries", huge), "larger than 16 MiB")
    assert server.seen == []


# ------------------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("{", ["--extra-body: not JSON"]),
        ("[1]", ["a JSON object is needed, not [1]"]),
        ('"x"', ["a JSON object is needed"]),
        ("null", ["a JSON object is needed"]),
        ("[" * 100_000, ["--extra-body: not JSON"]),
        ('{"model": "other"}', ["'model' names the adapter or the base", "--adapter or --base-model"]),
        ('{"lora_path": "x"}', ["'lora_path' names the adapter", "--adapter"]),
        ('{"adapters": "x"}', ["'adapters' names the adapter"]),
        ('{"prompt": "x"}', ["the probe sets 'prompt' itself"]),
        ('{"stream": true}', ["the probe sets 'stream' itself"]),
        ('{"logprobs": 5}', ["the probe sets 'logprobs' itself"]),
        ('{"repetition_penalty": 1.1}', ["'repetition_penalty' changes the logprobs the server returns"]),
        ('{"presence_penalty": 0.5}', ["'presence_penalty' changes the logprobs"]),
        ('{"frequency_penalty": 0.5}', ["'frequency_penalty' changes the logprobs"]),
        ('{"logit_bias": {"5": 10}}', ["'logit_bias' changes the logprobs"]),
    ],
)
def test_a_bad_extra_body_is_one_line(
    cli: Any, stub: Any, canaries: Path, extra: str, words: list[str]
) -> None:
    server = stub()
    one_line(
        cli("probe", url(server), "--adapter", "a", "--canaries", canaries, "--extra-body", extra), *words
    )
    assert server.seen == []


def test_the_users_own_extra_fields_are_sent(cli: Any, stub: Any, canaries: Path) -> None:
    server = stub()
    r = cli(
        "probe",
        url(server),
        "--adapter",
        "a",
        "--canaries",
        canaries,
        "--extra-body",
        '{"user": "ci", "seed": 1}',
    )
    assert r.exit_code == 0, r.output
    assert server.bodies and all(
        isinstance(b, dict) and b["user"] == "ci" and b["seed"] == 1 and b["model"] == "a"
        for b in server.bodies
    ), server.bodies


def test_an_empty_api_key_variable_is_one_line(cli: Any, stub: Any, canaries: Path) -> None:
    server = stub()
    r = cli(
        "probe", url(server), "--adapter", "a", "--canaries", canaries, "--api-key-env", "K", env={"K": ""}
    )
    one_line(r, "K is not set or empty")
    assert server.seen == []


@pytest.mark.parametrize("key", ["sekret-123\n", "sekret 123", "sekret-\u043a\u043b\u044e\u0447"])
def test_an_api_key_no_header_can_carry_is_not_printed(cli: Any, stub: Any, canaries: Path, key: str) -> None:
    """http.client's own error would print the header with the key in it."""
    server = stub()
    r = cli(
        "probe", url(server), "--adapter", "a", "--canaries", canaries, "--api-key-env", "K", env={"K": key}
    )
    one_line(r, "the API key in K holds a space, a newline or a character beyond ASCII")
    assert "sekret" not in r.stderr and server.seen == []


@pytest.mark.parametrize(
    ("given", "shown", "why"),
    [
        ("http://user:pw@127.0.0.1:9", "http://127.0.0.1:", "a user or password"),
        ("http://127.0.0.1:9/v1?x=1", "?x=1", "a query or a fragment"),
        ("http://127.0.0.1:9/#top", "#top", "a query or a fragment"),
    ],
)
def test_a_url_with_more_than_a_server_is_refused(
    cli: Any, canaries: Path, given: str, shown: str, why: str
) -> None:
    r = cli("probe", given, "--adapter", "a", "--canaries", canaries)
    one_line(r, shown, why)
    assert "pw" not in r.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e300"])
def test_a_timeout_that_is_no_time_is_one_line(cli: Any, stub: Any, canaries: Path, value: str) -> None:
    one_line(
        cli("probe", url(stub()), "--adapter", "a", "--canaries", canaries, "--timeout", value), "--timeout"
    )


@pytest.mark.parametrize("option", ["--output-file", "--junit-file"])
def test_a_report_over_the_canaries_is_refused(cli: Any, stub: Any, canaries: Path, option: str) -> None:
    before = canaries.read_bytes()
    server = stub()
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries, option, canaries)
    assert r.exit_code == 3 and len(r.stderr.strip().splitlines()) == 1 and option in r.stderr, r.stderr
    assert canaries.read_bytes() == before and server.seen == []


def test_nothing_is_written_when_the_server_fails(
    cli: Any, stub: Any, canaries: Path, tmp_path: Path
) -> None:
    """A text report and a JUnit file are not written when the server cannot be probed."""
    out, junit = tmp_path / "out.txt", tmp_path / "junit.xml"
    server = stub(post=send(200, b"nope"))
    r = cli(
        "probe",
        url(server),
        "--adapter",
        "a",
        "--canaries",
        canaries,
        "--output-file",
        out,
        "--junit-file",
        junit,
    )
    one_line(r, "returned no JSON")
    assert not out.exists() and not junit.exists()


# -------------------------------------------------------------------------------------------------- 80 columns


def test_the_text_report_fits_80_columns(cli: Any, stub: Any, canaries: Path) -> None:
    server = stub(post=send(200, _vllm_answer(0.5)))
    r = cli(
        "probe",
        url(server),
        "--adapter",
        "a-rather-long-adapter-name",
        "--canaries",
        canaries,
        env={"COLUMNS": "80"},
    )
    assert r.exit_code == 1, r.output
    # a URL or a path (the canaries file's, as long as the temporary folder makes it) is one word: no break in it
    long = [
        line
        for line in r.stdout.splitlines()
        if len(line) > 80
        and not any(w.startswith("http://") or w.rstrip(";,") == str(canaries) for w in line.split())
    ]
    assert long == [], r.stdout
