"""`inferctl logs` writes a node's log: to a terminal (a real pty here) control sequences in it are shown
as escapes, with or without --follow; to a pipe the exact text (cli/launch_cmd.py `log_writer`)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import termios

from infer_ctl.cli.launch_cmd import log_writer

# clear screen, write the clipboard (OSC 52), reverse what follows (U+202E), a bare CR
HOSTILE = "served\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\u202eevil\rX\n"
SHOWN = "served\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07\\u202eevil\\rX\n"


def _raw_pty() -> tuple[int, int]:
    """A pty whose output is not post-processed (no "\n" -> "\r\n"), so what was written is what is read."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def logs_on_a_tty(*argv: str, timeout_s: float = 60) -> str:
    """`inferctl logs ARGV` run as its own process with stdout on a terminal: what the terminal got."""
    master, slave = _raw_pty()
    proc = subprocess.Popen([sys.executable, "-m", "infer_ctl", "logs", *argv], stdout=slave,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
    os.close(slave)
    got = b""
    try:
        while True:
            ready = select.select([master], [], [], timeout_s)[0]
            if not ready:
                raise AssertionError(f"inferctl logs wrote nothing for {timeout_s} s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            got += chunk
    finally:
        proc.wait(timeout_s)
        os.close(master)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    return got.decode()


def _drain(fd: int) -> bytes:
    got = b""
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
    return got


def test_to_a_terminal_every_chunk_is_shown_as_escapes() -> None:
    master, slave = _raw_pty()
    with os.fdopen(slave, "w", encoding="utf-8") as tty:
        assert tty.isatty()
        write = log_writer(tty)
        write("line 1\n" + HOSTILE)  # the tail
        write(HOSTILE)  # a --follow chunk
        got = _drain(master).decode()
    os.close(master)
    assert got == "line 1\n" + SHOWN + SHOWN
    assert "\x1b" not in got and "\u202e" not in got and "\r" not in got


def test_to_a_pipe_the_log_is_exact() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "w", encoding="utf-8") as pipe:
        write = log_writer(pipe)
        write(HOSTILE)
        write("a\r\n")
    with os.fdopen(r, "rb") as out:
        assert out.read().decode() == HOSTILE + "a\r\n"
