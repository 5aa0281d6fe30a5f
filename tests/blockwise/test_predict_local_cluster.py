"""densecnn predict's local cluster listens on loopback only (Dask's HTTP servers default to every interface)."""

import ipaddress
import os

import pytest

pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

from densecnn.blockwise import BlockwiseOptions  # noqa: E402
from densecnn.blockwise.cluster import connect  # noqa: E402


def _listening_sockets() -> set[tuple[str, int]]:
    pids = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_the_local_cluster_listens_on_loopback_only(workers):
    before = _listening_sockets()
    with connect(BlockwiseOptions(workers=workers)) as (client, _):
        assert client.scheduler_info()["workers"]
        opened = _listening_sockets() - before
    assert opened, "the cluster opened no listening socket: the check would prove nothing"
    assert all(ipaddress.ip_address(host).is_loopback for host, _ in opened), opened
