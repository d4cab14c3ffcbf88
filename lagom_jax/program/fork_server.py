"""Fresh compile processes without a fresh interpreter's imports: a fork server.

Every deviceless compile runs in a process of its own (``gpu_compile.run_isolated``): XLA
aborts the whole process on some inputs, and a process's JAX platforms and CPU device count
are fixed once its backends start. Starting Python, JAX and lagom-jax costs about 2 s of a
10-15 s compile on a 2-core machine. So one server process imports them once (JAX limited to
the CPU, no backend started) and forks a child per compile: the child starts with the
imports done and is still a process of its own, whose abort or timeout costs only itself.

The protocol is one JSON line per message over the server's stdin and stdout: a request
``{"id", "module", "spec", "err", "env", "path", "cwd"}``, answered ``{"id", "pid"}`` once
forked and ``{"id", "status", "maxrss_kib"}`` (the exit code, negative for a signal, and the
child's peak resident memory, from ``os.wait4``) once the child ended. The child writes its
stdout and stderr to ``err`` and runs ``module._child(spec)`` with the caller's environment,
``sys.path`` and working folder of the moment (``XLA_FLAGS`` is read when the child's backend
starts). A server is started per set of ``JAX_*`` variables (JAX reads those when it is
imported). When the caller exits, the server's stdin closes and the server kills its children
and ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["ServerGone", "largest_child_rss_bytes", "run_child"]

# What the server imports once for every child.
PRELOAD = ("jax", "lagom_jax.advise.memory", "lagom_jax.models.compiled", "lagom_jax.program.hlo_compile")


class ServerGone(RuntimeError):
    """The fork server could not start or ended; the caller runs its child the plain way."""


# ------------------------------------------------------------------------------ the server


def serve() -> None:
    """The server's loop (run as ``python -c 'from lagom_jax.program.fork_server import serve; serve()'``)."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever an import prints must not reach the protocol
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    children: dict[int, str] = {}
    inbox = sys.stdin.buffer
    pending = b""
    while True:
        ready, _, _ = select.select([inbox], [], [], 0.05)
        if ready:
            chunk = os.read(inbox.fileno(), 1 << 16)
            if not chunk:  # the caller is gone: so are its compiles
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request)  # never returns
                children[pid] = request["id"]
                replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        while children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            replies.write(json.dumps({"id": children.pop(pid), "status": os.waitstatus_to_exitcode(status),
                                      "maxrss_kib": usage.ru_maxrss}) + "\n")


def _child(request: Mapping[str, Any]) -> None:
    code = 1
    try:
        fd = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        os.chdir(request["cwd"])
        module = __import__(request["module"], fromlist=["_child"])
        module._child(request["spec"])  # noqa: SLF001 - the module's child entry
        code = 0
    except BaseException:  # noqa: BLE001 - said on the child's stderr, its status says it failed
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# ------------------------------------------------------------------------------ the caller


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from lagom_jax.program.fork_server import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            # One thread (OpenBLAS starts a pool when NumPy loads), so that forking it is safe.
            env={**env, "OPENBLAS_NUM_THREADS": "1"})
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[str, dict[str, Any]] = {}
        self.alive = True
        threading.Thread(target=self._read, daemon=True, name="lagom-fork-server").start()

    def _read(self) -> None:
        global _largest_rss_kib
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._lock:
                slot = self._waiting.get(message["id"])
            if slot is None:
                continue
            if "pid" in message:
                slot["pid"] = message["pid"]
            else:
                slot["status"] = message["status"]
                _largest_rss_kib = max(_largest_rss_kib, int(message.get("maxrss_kib", 0)))
                slot["done"].set()
        with self._lock:
            self.alive = False
            for slot in self._waiting.values():
                slot["done"].set()

    def run(self, module: str, spec_path: str, err_path: str, env: Mapping[str, str], timeout_s: float) -> int:
        """The child's exit status; TimeoutError past ``timeout_s`` (the child killed)."""
        with self._lock:
            if not self.alive:
                raise ServerGone("the fork server ended")
            self._next += 1
            key = str(self._next)
            slot = self._waiting[key] = {"done": threading.Event(), "pid": None, "status": None}
            request = {"id": key, "module": module, "spec": spec_path, "err": err_path, "env": dict(env),
                       "path": list(sys.path), "cwd": os.getcwd()}
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as err:
                self.alive = False
                del self._waiting[key]
                raise ServerGone(f"the fork server ended: {err}") from None
        try:
            if not slot["done"].wait(timeout_s):
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(slot["pid"], signal.SIGKILL)
                slot["done"].wait(5)
                raise TimeoutError(f"the child took over {timeout_s:.0f} s")
            if slot["status"] is None:
                raise ServerGone("the fork server ended while the child ran")
            return int(slot["status"])
        finally:
            with self._lock:
                self._waiting.pop(key, None)


_servers: dict[tuple, _Server] = {}
_largest_rss_kib = 0  # the largest peak resident memory of a child this process had forked
_servers_lock = threading.Lock()


def run_child(module: str, spec_path: str, err_path: str, env: Mapping[str, str], timeout_s: float) -> int:
    """``module._child(spec_path)`` in a child forked from the server for ``env``'s JAX
    settings; its exit status. ServerGone when no server could run it (the caller then starts
    a plain process); TimeoutError past ``timeout_s``."""
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("JAX_")))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or not server.alive:
            try:
                server = _servers[key] = _Server(env)
            except OSError as err:
                raise ServerGone(f"the fork server could not start: {err}") from None
    return server.run(module, spec_path, err_path, env, timeout_s)


def largest_child_rss_bytes() -> int:
    """The largest peak resident memory of any compile child of this process so far (bytes):
    the fork server's children as ``os.wait4`` reported them, and children waited for here."""
    import resource

    own_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return 1024 * max(_largest_rss_kib, own_children)
