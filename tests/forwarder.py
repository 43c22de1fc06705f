"""A loopback TCP forwarder to a PostgreSQL unix socket that can be switched to another
server: what a failover looks like from a client behind a virtual IP or a DNS flip. On a
switch every forwarded connection is cut, as the stopped primary's would be."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from slotd.dev.localpg import SERVER_USER, LocalPostgres


class Forwarder:
    def __init__(self, target: LocalPostgres) -> None:
        self.target = target
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{dbname}"

    def _socket(self) -> str:
        return str(Path(self.target.socket_dir) / f".s.PGSQL.{self.target.port}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._socket())
        except OSError:
            writer.close()
            return
        pair = {writer, up_writer}
        self._writers |= pair

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            for end in pair:
                end.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= pair

    def switch(self, target: LocalPostgres) -> None:
        """Point new connections at `target` and cut every existing one."""

        def cut() -> None:
            self.target = target
            for writer in list(self._writers):
                writer.close()

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        async def shutdown() -> None:
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)
