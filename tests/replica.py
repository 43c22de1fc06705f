"""A real streaming replica of a test server (`pg_basebackup -R`), optionally applying WAL
late (`recovery_min_apply_delay`): the read lane production points SLOTD_DATABASE_URL_READ
at, lag included. Also what a failover promotes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slotd.dev.localpg import SERVER_USER, LocalPostgres, find_bindir


@contextmanager
def streaming_replica(
    primary: LocalPostgres, apply_delay: str | None = None
) -> Iterator[LocalPostgres]:
    root = Path(tempfile.mkdtemp(prefix="slotd-replica-"))
    root.chmod(0o711)  # as root the server runs as another user, who must pass through
    options = [f"-c recovery_min_apply_delay={apply_delay}"] if apply_delay else []
    replica = LocalPostgres(
        root=root / "pg",
        socket_dir=root / "sock",
        port=primary.port,
        fast=True,
        extra_options=options,
    )
    replica._own(replica.root)
    source = f"host={primary.socket_dir} port={primary.port} user={SERVER_USER}"
    replica._cmd(
        [
            str(find_bindir() / "pg_basebackup"),
            "-D",
            str(replica.datadir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            source,
        ]
    )
    try:
        replica.start()
        yield replica
    finally:
        replica.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def promote(server: LocalPostgres) -> None:
    """Make a standby the primary, waiting until it accepts writes."""
    server._cmd([str(find_bindir() / "pg_ctl"), "-D", str(server.datadir), "-w", "promote"])
