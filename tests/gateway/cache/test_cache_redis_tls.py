"""L2 over TLS (``rediss://``) against a real redis-server with a throwaway CA and certificate.

TLS is selected by the URL alone; the CA file travels in the URL's query string the way
redis-py documents (``?ssl_ca_certs=...``), and the hostname is verified.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from gateway.cache.entry import Entry
from gateway.cache.keys import derive_key
from gateway.cache.redis import RedisCache
from gateway.cache.settings import RedisSettings
from tests.conftest import free_port, wait_port

pytestmark = pytest.mark.redis


def _make_certs(d: str) -> None:
    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=gw-test-ca")
    ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext")


@pytest.fixture(scope="module")
def tls_url() -> Iterator[str]:
    exe, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if exe is None or openssl is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server and openssl are needed for the TLS test")
        pytest.skip("redis-server or openssl is not installed")
    workdir = tempfile.mkdtemp(prefix="gw-redis-tls-")
    try:
        _make_certs(workdir)
        port = free_port()
        proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(port),
             "--tls-cert-file", "server.pem", "--tls-key-file", "server.key",
             "--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no",
             "--save", "", "--appendonly", "no", "--dir", workdir],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(port, 15)
            yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={workdir}/ca.pem"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_tls_by_url(tls_url: str) -> None:
    cache = RedisCache(RedisSettings(url=tls_url, timeout_s=1.0, connect_timeout_s=2.0))
    try:
        key = derive_key(route="/v1/embeddings", model="minilm", model_version="1",
                         scope="tenant-a", normalization="n1", canonical=b"over tls")
        assert await cache.store([(key, Entry(b"secret vector", time.time(), 60))]) == 1
        got, ok = await cache.lookup([key])
        assert ok and got[0] is not None and got[0].value == b"secret vector"
    finally:
        await cache.close()


async def test_tls_with_an_untrusted_certificate_is_a_miss_not_an_error(tls_url: str) -> None:
    plain = tls_url.split("?", 1)[0]  # no CA given: the server's certificate is not trusted
    cache = RedisCache(RedisSettings(url=plain, timeout_s=1.0, connect_timeout_s=2.0))
    try:
        key = derive_key(route="r", model="m", model_version="1", scope="s", normalization="n",
                         canonical=b"x")
        got, ok = await cache.lookup([key])
        assert got == [None] and not ok
    finally:
        await cache.close()
