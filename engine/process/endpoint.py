"""The engine process's local socket: where other clients of one engine connect.

Owns the rules for the Unix socket path of ``EngineClient(listen=...)`` and
``EngineClient.attach(...)``: the folder must be the user's own and private (mode 0700, made
so when it does not exist), the socket is created with mode 0600, a path on which an engine
already listens is refused, a stale socket file left by a dead engine is replaced, and a
connecting peer must run as the same user (SO_PEERCRED). It must never open a socket that
another user of the machine can reach, and never follow a symlink into someone else's file:
a client's calls are pickles the engine process loads, so whoever can connect can run code
as the engine's user.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from multiprocessing.connection import Connection
from pathlib import Path

MAX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL


def default_socket_path() -> Path:
    """Where an engine listens unless told otherwise: $XDG_RUNTIME_DIR/gapless/engine.sock
    (a per-user folder the system keeps private), else /tmp/gapless-<uid>/engine.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "gapless" if runtime else Path(f"/tmp/gapless-{os.getuid()}")
    return folder / "engine.sock"


def _is_live(path: Path, timeout: float = 1.0) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ValueError(f"cannot tell whether an engine listens on {path}: {e}") from e
    finally:
        probe.close()
    return True


def check_folder(folder: Path) -> None:
    """ValueError unless ``folder`` is a real folder of this user that nobody else can use."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"the engine socket's folder {folder} is not a folder")
    if st.st_uid != os.getuid():
        raise ValueError(f"the engine socket's folder {folder} belongs to another user "
                         f"(uid {st.st_uid}); give a folder of your own with mode 0700")
    if st.st_mode & 0o077:
        raise ValueError(f"the engine socket's folder {folder} can be used by other users "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); give a folder with mode 0700 "
                         "(or a path in a folder that does not exist yet: it is made so)")


def check_listen_path(path: str | os.PathLike[str]) -> Path:
    """The absolute socket path, if an engine may listen there; ValueError saying why not."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"listen must be a socket path, got {path!r}")
    p = Path(path).expanduser().absolute()
    if len(os.fsencode(p)) > MAX_PATH_BYTES:
        raise ValueError(f"the engine socket path {p} is longer than {MAX_PATH_BYTES} bytes "
                         "(a Unix socket's limit); give a shorter path")
    if p.parent.exists():
        check_folder(p.parent)
    if p.is_symlink() or p.exists():
        if not stat.S_ISSOCK(os.lstat(p).st_mode):
            raise ValueError(f"{p} exists and is not a socket; give another path")
        if _is_live(p):
            raise ValueError(f"an engine is already listening on {p}; attach to it "
                             "(EngineClient.attach) or give another path")
    return p


def bind(path: str | os.PathLike[str]) -> tuple[socket.socket, Path]:
    """Listen on ``path`` (checked as check_listen_path does; a stale socket is removed)."""
    p = check_listen_path(path)
    if not p.parent.exists():
        p.parent.mkdir(mode=0o700, parents=True)
        check_folder(p.parent)  # a folder someone else made in between is refused
    if p.is_symlink() or p.exists():
        p.unlink()  # a socket nobody listens on (checked above)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is 0600 from the moment it exists
    try:
        sock.bind(str(p))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {p}: {e}") from e
    finally:
        os.umask(old)
    os.chmod(p, 0o600)
    sock.listen(16)
    return sock, p


def connect(path: str | os.PathLike[str], timeout: float) -> socket.socket:
    """A connected, blocking socket to the engine listening on ``path``; ValueError when
    there is none (no such socket, nobody listening, or not ours)."""
    p = Path(path).expanduser().absolute()
    if not (p.is_symlink() or p.exists()):
        raise ValueError(f"no engine socket at {p} (is `EngineClient(listen=...)` running?)")
    if not stat.S_ISSOCK(os.lstat(p).st_mode):
        raise ValueError(f"{p} is not a socket")
    check_folder(p.parent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(p))
    except OSError as e:
        sock.close()
        raise ValueError(f"no engine is listening on {p} ({e.strerror or e})") from e
    sock.setblocking(True)
    return sock


def hang_up(conn: Connection) -> None:
    """Shut a connection's socket down both ways: the peer sees EOF and a thread blocked
    reading it here wakes up (a plain close() does neither while a read is in progress)."""
    try:
        sock = socket.socket(fileno=conn.fileno())
    except OSError:  # already closed
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
