"""The extender tells the truth about its cache: when it loses the API server, it stops deciding.

`neuronetes extender serve` reaches the API server through a TCP proxy in this process. Cutting
the proxy breaks every watch; past ``maxWatchStalenessSeconds`` (2 s here) ``/readyz`` answers
503 and filter an Error, which kube-scheduler retries, instead of placing from a stale cache.
With the proxy back, the watches relist and the extender is ready again.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderProcess, free_port
from extender_support import gpu_pod

pytestmark = pytest.mark.e2e


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target` (TLS passes through untouched) until `cut`."""

    def __init__(self, target: tuple[str, int], port: int) -> None:
        self.target = target
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread.start()

    def _run(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def open(self) -> None:
        self._run(self._open())

    def cut(self) -> None:
        self._run(self._cut())

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture()
def proxied(cluster: E2ECluster, tmp_path: Path) -> Iterator[tuple[TcpProxy, ExtenderProcess]]:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = urlsplit(doc["clusters"][0]["cluster"]["server"])
    proxy = TcpProxy((server.hostname or "127.0.0.1", server.port or 443), free_port())
    proxy.open()
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    config = tmp_path / "extender.yaml"
    config.write_text("maxWatchStalenessSeconds: 2\n")
    ext = ExtenderProcess(kubeconfig, tmp_path, config)
    try:
        ext.start()
        yield proxy, ext
    finally:
        ext.stop()
        proxy.close()


def _readyz(ext: ExtenderProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{ext.url}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _filter_error(ext: ExtenderProcess) -> str:
    body = json.dumps({"Pod": gpu_pod("probe"), "NodeNames": ["any"]}).encode()
    request = urllib.request.Request(
        f"{ext.url}/filter", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(json.loads(response.read())["Error"])


def test_losing_the_api_server_makes_the_extender_unready_and_its_filter_refuse(
    proxied: tuple[TcpProxy, ExtenderProcess],
) -> None:
    proxy, ext = proxied
    assert _readyz(ext)[0] == 200
    assert "watch broken" not in _filter_error(ext)
    proxy.cut()
    _, text = wait_until(lambda: r if (r := _readyz(ext))[0] == 503 else None, timeout=30, what="/readyz 503")
    assert "watch broken" in text, text
    assert "watch broken" in _filter_error(ext)
    proxy.open()
    wait_until(lambda: _readyz(ext)[0] == 200, timeout=60, what="/readyz 200 again once the API is back")
