"""Ctrl-C is never lost (issue 25's trial): Python prints a KeyboardInterrupt raised while a finaliser or weakref
callback runs as "Exception ignored" and goes on, so a train-smoke run whose SIGINT landed there trained every
remaining layout and exited 0 (seen in tests/commands/test_stranger.py). Commands now remember the interrupt and
long loops raise it again at their next step (``adapterdoc.errors.raise_if_interrupted``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="POSIX signals")

_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import click
    from adapterdoc.commands import options as opt
    from adapterdoc.errors import raise_if_interrupted

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside __del__: Python ignores what it raises

    @click.command("long-run")
    @opt.handle_errors
    def command():
        Finaliser()  # made and finalised at once
        print("after the finaliser", flush=True)
        if sys.argv[1] == "check":
            raise_if_interrupted()
        print("finished", flush=True)

    command(sys.argv[2:], prog_name="long-run")
    """
)


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=120, env={**os.environ}
    )


def test_python_swallows_an_interrupt_raised_in_a_finaliser() -> None:
    """The library fact the fix rests on: in plain Python the program runs to its end, exits 0, and prints a
    traceback ("Exception ignored in ...")."""
    plain = textwrap.dedent(
        """
        import os, signal, time
        class Finaliser:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        Finaliser()
        print("finished", flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "finished" in r.stdout, r.stdout + r.stderr
    assert "Exception ignored" in r.stderr and "KeyboardInterrupt" in r.stderr


def test_a_swallowed_interrupt_is_raised_at_the_next_check_and_exits_130() -> None:
    r = _run("check")
    assert r.returncode == 130, r.stdout + r.stderr
    assert "after the finaliser" in r.stdout and "finished" not in r.stdout
    assert r.stderr.strip().splitlines() == ["adapterdoc: error: long-run: interrupted by the user"], r.stderr


def test_the_default_handler_is_back_after_the_command() -> None:
    from adapterdoc.errors import remembered_interrupts

    before = signal.getsignal(signal.SIGINT)
    with remembered_interrupts():
        inside = signal.getsignal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert inside is not before or before is not signal.default_int_handler
