"""The GitHub Action (action.yml): its inputs reach the scripts only through `env:`, the install step's exact pip
command lines (CPU torch by default), and the verify step run for real on tiny adapters whose paths have spaces."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _action() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))


def _step(name: str) -> dict[str, Any]:
    (step,) = [s for s in _action()["runs"]["steps"] if s["name"].startswith(name)]
    return step


def _env(step: dict[str, Any], action_path: Path, **inputs: str) -> dict[str, str]:
    """The step's environment as the runner would build it: each ``${{ ... }}`` replaced by its value."""
    spec = _action()["inputs"]
    values = {k: str(v.get("default", "")) for k, v in spec.items()}
    values.update({k.replace("_", "-"): v for k, v in inputs.items()})
    context = {f"inputs.{k}": v for k, v in values.items()} | {"github.action_path": str(action_path)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERDOC_")}
    for key, template in step.get("env", {}).items():
        env[key] = EXPR.sub(lambda m: context[m.group(1)], str(template))
    return env


def _run_step(step: dict[str, Any], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert step["shell"] == "bash"
    return subprocess.run(["bash", "-c", step["run"]], env=env, cwd=cwd, capture_output=True, text=True)


def test_every_input_goes_through_env_and_no_script_interpolates_one() -> None:
    action = _action()
    used: set[str] = set()
    for step in action["runs"]["steps"]:
        assert "${{" not in step["run"], f"{step['name']}: an expression inside run: is shell-injected"
        for value in step.get("env", {}).values():
            exprs = EXPR.findall(str(value))
            assert len(exprs) == 1 and EXPR.fullmatch(str(value)), value  # the whole value, nothing glued on
            used.update(e.removeprefix("inputs.") for e in exprs if e.startswith("inputs."))
        script = re.search(r'/(scripts/action/[\w.]+)"', step["run"])
        assert script and (ROOT / script.group(1)).is_file(), step["run"]
    assert used == set(action["inputs"])
    assert action["inputs"]["torch-index-url"]["default"] == CPU_INDEX


@pytest.fixture
def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A ``python`` on PATH that records its argv (one call per line, arguments NUL-separated) and succeeds."""
    bindir, log = tmp_path / "fake bin", tmp_path / "calls.log"
    bindir.mkdir()
    exe = bindir / "python"
    exe.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> "{log}"\necho >> "{log}"\n')
    exe.chmod(0o755)
    return bindir, log


def _calls(log: Path) -> list[list[str]]:
    return [line.rstrip("\0").split("\0") for line in log.read_text().splitlines() if line]


PIP = ["-m", "pip", "install", "--disable-pip-version-check"]
TAIL = ["--no-cache-dir", "torch<3"]


@pytest.mark.parametrize(
    ("inputs", "torch_call"),
    [
        ({"ml": "true"}, [*PIP, "--index-url", CPU_INDEX, "torch"]),
        (
            {"ml": "true", "torch_spec": "torch==2.5.1+cpu"},
            [*PIP, "--index-url", CPU_INDEX, "torch==2.5.1+cpu"],
        ),
        ({"ml": "true", "torch_index_url": ""}, [*PIP, "torch"]),  # opt out: pip's default index
        (
            {
                "ml": "true",
                "pip_args": "--extra-index-url https://mirror.example/simple  --no-cache-dir",
                "torch_spec": "torch<3",
            },
            [*PIP, "--index-url", CPU_INDEX, "--extra-index-url", "https://mirror.example/simple", *TAIL],
        ),
    ],
)
def test_install_step_pip_command_lines(
    fake_python: tuple[Path, Path], tmp_path: Path, inputs: dict[str, str], torch_call: list[str]
) -> None:
    """CPU torch from PyTorch's index first, then the action's own folder with the ml and gguf extras."""
    action_path = tmp_path / "my action"  # the runner's checkout of the action; a space in it must not matter
    shutil.copytree(ROOT / "scripts" / "action", action_path / "scripts" / "action")
    bindir, log = fake_python
    env = _env(_step("Install"), action_path, **inputs)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    res = _run_step(_step("Install"), env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert _calls(log) == [torch_call, [*PIP, f"{action_path}[ml,gguf]"]]


@pytest.mark.parametrize("ml", ["false", "", "no"])
def test_install_step_defaults_to_the_base_package(
    fake_python: tuple[Path, Path], tmp_path: Path, ml: str
) -> None:
    """verify's static checks need no torch: the default install is the action's folder with the gguf extra (a GGUF
    adapter's tensors are read with numpy and gguf-py), one pip call."""
    action_path = tmp_path / "my action"
    shutil.copytree(ROOT / "scripts" / "action", action_path / "scripts" / "action")
    bindir, log = fake_python
    env = _env(_step("Install"), action_path, **({} if ml == "false" else {"ml": ml}))
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    res = _run_step(_step("Install"), env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert _calls(log) == [[*PIP, f"{action_path}[gguf]"]]
    assert _action()["inputs"]["ml"]["default"] == "false"


def test_install_step_stops_at_the_first_failure(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text("#!/usr/bin/env bash\necho no index >&2\nexit 1\n")
    (bindir / "python").chmod(0o755)
    env = _env(_step("Install"), ROOT)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    res = _run_step(_step("Install"), env, tmp_path)
    assert res.returncode == 1 and res.stderr.count("no index") == 1


# ------------------------------------------------------------------------------------------ the verify step, for real


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository checkout with two real tiny adapters in folders whose names have spaces: one that passes on
    tiny:qwen3_5_text, and a VL one that must fail there."""
    peft = pytest.importorskip("peft")
    from adapterdoc.ml.tiny import build_tiny
    from adapterdoc.train.lora import lora_config

    ws = tmp_path_factory.mktemp("work space")
    for name, layout in (("good one", "qwen3_5_text"), ("vl one", "qwen3_5_vl")):
        cfg = lora_config(layout)
        cfg.init_lora_weights = False  # non-zero lora_B
        peft.get_peft_model(build_tiny(layout), cfg).save_pretrained(ws / "adapters" / name)
    (ws / "reports dir").mkdir()
    return ws


def _verify(workspace: Path, tmp_path: Path, **inputs: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "python"  # `python` on PATH as setup-python leaves it (PYTHONPATH kept)
    if not exe.exists():  # a wrapper, not a symlink: a venv's python found through a symlink loses its venv
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        exe.chmod(0o755)
    env = _env(_step("Verify"), ROOT, **inputs)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    return _run_step(_step("Verify"), env, workspace)


def _annotations(stdout: str) -> list[tuple[str, str]]:
    """(level, file) of every workflow command line."""
    return re.findall(r"^::(error|warning|notice) file=([^,]*)", stdout, re.M)


@pytest.mark.ml
def test_verify_step_annotations_and_junit_in_one_run(workspace: Path, tmp_path: Path) -> None:
    res = _verify(
        workspace,
        tmp_path,
        adapters="adapters/*",  # a glob that matches two folders with spaces in their names
        base="tiny:qwen3_5_text",
        junit_file="reports dir/adapterdoc junit.xml",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    found = _annotations(res.stdout)
    assert (
        "error",
        "adapters/vl one/adapter_model.safetensors",
    ) in found  # unexpected keys: the weights file
    assert ("error", "adapters/vl one/adapter_config.json") in found  # the layout move: the config
    assert {f for _, f in found} <= {
        f"adapters/{a}/{f}"
        for a in ("good one", "vl one")
        for f in ("adapter_config.json", "adapter_model.safetensors")
    }
    assert res.stdout.splitlines()[-1] == "adapterdoc verify: 1 of 2 adapter(s) passed"
    suite = ET.parse(workspace / "reports dir" / "adapterdoc junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"adapters/good one", "adapters/vl one"}
    assert (
        cases["adapters/vl one"].find("failure") is not None
        and cases["adapters/good one"].find("failure") is None
    )


@pytest.mark.ml
def test_verify_step_one_adapter_per_line_and_output_file_instead_of_the_log(
    workspace: Path, tmp_path: Path
) -> None:
    res = _verify(
        workspace,
        tmp_path,
        adapters="adapters/good one\n",  # a YAML block: one path per line
        base="tiny:qwen3_5_text",
        profile="vllm",
        output_file="reports dir/annotations.txt",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == ""  # --output-file: instead of stdout
    written = (workspace / "reports dir" / "annotations.txt").read_text()
    assert ("notice", "adapters/good one/adapter_config.json") in _annotations(written)
    assert "AD416" in written  # the vllm profile reached verify


@pytest.mark.ml
def test_verify_step_inputs_are_never_shell_code(workspace: Path, tmp_path: Path) -> None:
    res = _verify(
        workspace, tmp_path, adapters="$(touch pwned) `touch pwned2`", base="tiny:qwen3_5_text; touch pwned3"
    )
    assert res.returncode == 3
    assert not any((workspace / p).exists() for p in ("pwned", "pwned2", "pwned3"))
    assert "adapterdoc: error:" in res.stderr


def test_verify_step_without_adapters_is_one_error_line(tmp_path: Path) -> None:
    res = _verify(tmp_path, tmp_path, adapters=" \n ")
    assert res.returncode == 3 and res.stderr.strip().splitlines() == [
        "adapterdoc: error: the action's 'adapters' input names no adapter folder"
    ]


# ------------------------------------------------------------------------------------- the options the Action uses


@pytest.mark.ml
def test_junit_file_beside_any_format_and_output_file_replaces_stdout(
    cli: Any, workspace: Path, tmp_path: Path
) -> None:
    good = str(workspace / "adapters" / "good one")
    junit = tmp_path / "j.xml"
    res = cli("verify", good, "--base", "tiny:qwen3_5_text", "--format", "github", "--junit-file", junit)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == "adapterdoc verify: 1 of 1 adapter(s) passed"  # stdout still has it
    assert ET.parse(junit).getroot().find("testsuite").get("tests") == "1"  # type: ignore[union-attr]
    out = tmp_path / "o.json"
    res = cli(
        "verify", good, "--base", "tiny:qwen3_5_text", "--json", "--output-file", out, "--junit-file", junit
    )
    assert res.exit_code == 0 and res.stdout == ""
    assert out.read_text().startswith("{") and junit.read_text().startswith("<?xml")
    same = cli("verify", good, "--base", "tiny:qwen3_5_text", "--output-file", junit, "--junit-file", junit)
    assert same.exit_code == 2 and "same file" in same.stderr
    inside = cli("verify", good, "--base", "tiny:qwen3_5_text", "--junit-file", Path(good) / "x.xml")
    assert inside.exit_code == 3 and "--junit-file would overwrite or sit inside the input" in inside.stderr


@pytest.mark.ml
def test_github_annotation_points_at_the_line_of_a_config_field(
    cli: Any, workspace: Path, tmp_path: Path
) -> None:
    """A finding about a config field (here a typo of lora_alpha) attaches to that field's line."""
    import json

    adapter = tmp_path / "typo adapter"
    shutil.copytree(workspace / "adapters" / "good one", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["lora_alhpa"] = config.pop("lora_alpha")
    (adapter / "adapter_config.json").write_text(json.dumps(config, indent=2))
    line = next(
        n
        for n, text in enumerate((adapter / "adapter_config.json").read_text().splitlines(), 1)
        if "lora_alhpa" in text
    )
    res = cli("verify", adapter, "--base", "tiny:qwen3_5_text", "--format", "github")
    assert res.exit_code == 1, res.output
    (hit,) = [x for x in res.stdout.splitlines() if "(key: lora_alhpa)" in x]
    assert hit.startswith(f"::error file={adapter}/adapter_config.json,line={line},title=")


# ----------------------------------------------------------------------------------- the post-deploy (probe) step


def _runs(step: dict[str, Any], **inputs: str) -> bool:
    """Whether the runner runs ``step`` for ``inputs``: its ``if:`` is a disjunction of ``inputs.X == ''`` /
    ``inputs.X != ''`` tests (the only forms the Action uses; anything else fails here)."""
    condition = step.get("if")
    if condition is None:
        return True
    values = {k: str(v.get("default", "")) for k, v in _action()["inputs"].items()}
    values.update({k.replace("_", "-"): v for k, v in inputs.items()})
    result = False
    for term in str(condition).split("||"):
        m = re.fullmatch(r"\s*inputs\.([\w-]+) (==|!=) ''\s*", term)
        assert m, f"an `if:` form this test cannot read: {term!r}"
        result |= (values[m.group(1)] == "") == (m.group(2) == "==")
    return result


def test_the_steps_that_run_for_each_gate() -> None:
    verify, probe = _step("Verify"), _step("Probe")
    assert _runs(verify, adapters="a") and not _runs(probe, adapters="a")  # pre-deploy
    assert not _runs(verify, probe_url="http://x") and _runs(probe, probe_url="http://x")  # post-deploy
    assert _runs(verify, adapters="a", probe_url="http://x") and _runs(
        probe, adapters="a", probe_url="http://x"
    )
    assert _runs(verify) and not _runs(probe)  # nothing given: verify says what is missing (one line, exit 3)


def _probe_step(tmp_path: Path, **inputs: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "python"
    if not exe.exists():
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        exe.chmod(0o755)
    env = _env(_step("Probe"), ROOT, **inputs)
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    return _run_step(_step("Probe"), env, tmp_path)


@pytest.fixture
def canaries(tmp_path: Path) -> Path:
    from adapterdoc.probe.canaries import Canaries, Canary, Position, save, scale_grid

    scales = scale_grid(4)
    canary = Canary("w1 w2 w3", [5, 6, 7], [Position(2, 7, [-1.0 - 0.1 * s for s in scales])])
    path = tmp_path / "run dir" / "canaries.json"
    path.parent.mkdir()
    save(Canaries("a", "b", 4, "float32", list(scales), [canary]), path)
    return path


def test_probe_step_against_a_server_that_is_down(tmp_path: Path, canaries: Path) -> None:
    """Exit 3, one line on stderr, the annotation on the log; an API key variable that is not set is named."""
    from tests.probe.servers import free_port

    res = _probe_step(
        tmp_path,
        probe_url=f"http://127.0.0.1:{free_port()}",
        probe_adapter="customer-a",
        probe_canaries="run dir/canaries.json",
        probe_api_key_env="STAGING_KEY",
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "STAGING_KEY" in res.stderr  # not set in this environment: said, before any request
    os.environ["STAGING_KEY"] = "sekret-42"
    try:
        res = _probe_step(
            tmp_path,
            probe_url=f"http://127.0.0.1:{free_port()}",
            probe_adapter="customer-a",
            probe_canaries="run dir/canaries.json",
            probe_api_key_env="STAGING_KEY",
        )
    finally:
        del os.environ["STAGING_KEY"]
    assert res.returncode == 3
    assert [line for line in res.stderr.splitlines() if line] == [res.stderr.strip()]
    assert "cannot connect" in res.stderr and res.stdout.startswith("::error")


def test_probe_step_never_shows_the_key(tmp_path: Path, canaries: Path) -> None:
    """The key set from a secret reaches the probe (the server gets it) and a server echoing it in its error shows
    *** on the log and in stderr, never the key."""
    from tests.probe.stub_server import close, echo_key, send, start, url

    server = start(send(200, {"data": [{"id": "a", "owned_by": "vllm"}]}), echo_key(400))
    os.environ["STAGING_KEY"] = "sekret-42"  # as the workflow step's env sets it from a secret
    try:
        res = _probe_step(
            tmp_path,
            probe_url=url(server),
            probe_adapter="customer-a",
            probe_canaries="run dir/canaries.json",
            probe_api_key_env="STAGING_KEY",
        )
    finally:
        del os.environ["STAGING_KEY"]
        close(server)
    assert res.returncode == 3 and "Bearer ***" in res.stderr, res.stdout + res.stderr
    assert "sekret" not in res.stdout + res.stderr and res.stdout.startswith("::error")


def test_probe_step_passes_the_timeout(tmp_path: Path, canaries: Path) -> None:
    res = _probe_step(
        tmp_path,
        probe_url="http://127.0.0.1:9",
        probe_adapter="a",
        probe_canaries=str(canaries),
        probe_timeout="0",
    )
    # the value reached probe's own check of --timeout
    assert res.returncode == 3 and "--timeout: 0 is not a number of seconds" in res.stderr, res.stderr


def test_probe_step_passes_the_served_dtype(tmp_path: Path, canaries: Path) -> None:
    res = _probe_step(
        tmp_path,
        probe_url="http://127.0.0.1:9",
        probe_adapter="a",
        probe_canaries=str(canaries),
        probe_served_dtype="x",
    )
    # the value reached probe's own choice of --served-dtype
    assert res.returncode == 2 and "--served-dtype" in res.stderr, res.stderr


@pytest.mark.parametrize("report", ["output_file", "junit_file"])
def test_probe_step_refuses_to_overwrite_verifys_report(tmp_path: Path, canaries: Path, report: str) -> None:
    """verify and the probe in one step would write the same report file: one line, exit 3, nothing probed."""
    res = _probe_step(
        tmp_path,
        adapters="adapter",
        probe_url="http://127.0.0.1:9",
        probe_adapter="a",
        probe_canaries=str(canaries),
        **{report: "report.out"},
    )
    assert res.returncode == 3 and res.stderr.strip().splitlines() == [
        "adapterdoc: error: the action's 'adapters' and 'probe-url' inputs would both write "
        "'output-file'/'junit-file'; run the probe in its own step"
    ], res.stderr
    res = _probe_step(
        tmp_path,
        adapters="adapter",
        probe_url="http://127.0.0.1:9",
        probe_adapter="a",
        probe_canaries=str(canaries),
    )
    assert "cannot connect" in res.stderr  # without a report file, both write annotations: allowed


def test_probe_step_needs_the_adapter_and_the_canaries(tmp_path: Path) -> None:
    res = _probe_step(tmp_path, probe_url="http://127.0.0.1:9", probe_canaries="c.json")
    assert res.returncode == 3 and res.stderr.strip().splitlines() == [
        "adapterdoc: error: the action's 'probe-adapter' input is empty; the probe needs it with 'probe-url'"
    ]
    res = _probe_step(tmp_path, probe_url="http://127.0.0.1:9", probe_adapter="a")
    assert res.returncode == 3 and "'probe-canaries' input is empty" in res.stderr


def test_probe_step_inputs_are_never_shell_code(tmp_path: Path, canaries: Path) -> None:
    res = _probe_step(
        tmp_path,
        probe_url="http://127.0.0.1:9/$(touch pwned)",
        probe_adapter="`touch pwned2`",
        probe_canaries="run dir/canaries.json",
        probe_extra_body='{"x": "$(touch pwned3)"}',
        probe_base_model="; touch pwned4",
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert not any((tmp_path / p).exists() for p in ("pwned", "pwned2", "pwned3", "pwned4"))
