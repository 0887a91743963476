"""A Redis Cluster of `redis-server` (or `valkey-server`) processes on 127.0.0.1, for the shared
tier's tests and benchmarks/bench_shared_cache.py: N primaries with R replicas each, no
persistence, a short `cluster-node-timeout` (so a failover takes a second or two), built with
`redis-cli --cluster create`. A primary can be killed, hung (SIGSTOP) or have a slot migrated
off it, key by key, to see what the tier does while the cluster heals.

Each node listens on a free port of its own and gossips on another (`cluster-port`); the cluster
is made for a cache: `cluster-require-full-coverage no` (the other primaries keep serving while
one's slots fail over) and `cluster-replica-validity-factor 0` (a replica is always allowed to
take over, however long its link to the primary was down)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import redis


class ClusterError(RuntimeError):
    """The local cluster could not be started or did not settle in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _command(client: redis.Redis, *args: object) -> Any:
    """One node's reply to a raw command (CLUSTER ..., MIGRATE): redis-py leaves execute_command
    unannotated."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]  # see the docstring


class NodeRow(TypedDict):
    """A node as CLUSTER NODES shows it (`LocalCluster.topology`)."""

    id: str
    port: int
    flags: set[str]  # "master" / "slave", "fail", "fail?", "myself", ...
    primary_id: str  # "-" for a primary
    link: str  # "connected" / "disconnected"
    slots: list[tuple[int, int]]  # ranges served, inclusive


def server_binaries(kind: str = "redis") -> tuple[str, str] | None:
    """(server, cli) for "redis" or "valkey", or None where either is not installed."""
    server, cli = shutil.which(f"{kind}-server"), shutil.which(f"{kind}-cli")
    return (server, cli) if server and cli else None


def _slot_range(part: str) -> tuple[int, int]:
    """A CLUSTER NODES slot field ("5461-10922", or "42" for one slot) as (first, last)."""
    first, _, last = part.partition("-")
    return int(first), int(last or first)


@dataclass
class Node:
    port: int
    bus_port: int
    process: subprocess.Popen[bytes]
    hung: bool = False
    first_slot: int | None = None  # of the slots it served when it was killed or hung

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class LocalCluster:
    """`LocalCluster(directory).start()`: `primaries` primaries with `replicas` replicas each."""

    directory: str
    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    kind: str = "redis"
    maxmemory: str = "256mb"
    nodes: dict[int, Node] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """A startup node's URL (the cluster client finds the others)."""
        return f"redis://127.0.0.1:{self.live_ports()[0]}/0"

    def client(self, port: int) -> redis.Redis:
        """A plain client of one node (its own keys only)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5.0, socket_connect_timeout=5.0)

    def live_ports(self) -> list[int]:
        return [port for port, node in self.nodes.items() if node.process.poll() is None and not node.hung]

    # -- starting and stopping -------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> LocalCluster:
        """Starts the nodes and builds the cluster; a node that exits at once (another process
        took its port between the check and the bind) makes the whole start again, on new ports,
        up to `attempts` times."""
        binaries = server_binaries(self.kind)
        if binaries is None:
            raise ClusterError(f"{self.kind}-server / {self.kind}-cli are not installed")
        os.makedirs(self.directory, exist_ok=True)
        for attempt in range(attempts):
            try:
                return self._start(*binaries, timeout_s)
            except ClusterError:
                self.stop()
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start(self, server: str, cli: str, timeout_s: float) -> LocalCluster:
        for _ in range(self.primaries * (1 + self.replicas)):
            port, bus_port = free_port(), free_port()
            process = subprocess.Popen(
                [
                    server,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    str(bus_port),
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                    "--cluster-require-full-coverage",
                    "no",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self.directory,
                    "--maxmemory",
                    self.maxmemory,
                    "--maxmemory-policy",
                    "allkeys-lru",
                    "--proto-max-bulk-len",
                    "1gb",
                    "--logfile",
                    os.path.join(self.directory, f"{port}.log"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.nodes[port] = Node(port, bus_port, process)
        deadline = time.monotonic() + timeout_s
        for port, node in self.nodes.items():

            def up(port: int = port, node: Node = node) -> bool:
                if node.process.poll() is not None:
                    raise ClusterError(
                        f"node {port} exited with {node.process.returncode} (its log: "
                        f"{os.path.join(self.directory, f'{port}.log')})"
                    )
                return bool(self.client(port).ping())

            self._until(up, deadline, f"node {port} did not start")
        created = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(node.name for node in self.nodes.values()),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if created.returncode:
            raise ClusterError(f"{cli} --cluster create failed: {created.stdout[-2000:]} {created.stderr[-2000:]}")
        self.wait_healthy(deadline - time.monotonic())
        return self

    def stop(self) -> None:
        """Ends every node this cluster started (a hung one is killed as it is)."""
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.kill()
            node.process.wait()
        self.nodes.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the cluster looks like -----------------------------------------------------------------
    def topology(self, port: int | None = None) -> list[NodeRow]:
        """CLUSTER NODES as seen by `port` (a live node by default): one dict per node, with its
        port, role ("master" / "slave"), its primary's id, flags and slot ranges."""
        port = port if port is not None else self.live_ports()[0]
        rows: list[NodeRow] = []
        for line in _command(self.client(port), "CLUSTER", "NODES").decode().splitlines():
            fields = line.split()
            rows.append(
                {
                    "id": fields[0],
                    "port": int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                    "flags": set(fields[2].split(",")),
                    "primary_id": fields[3],
                    "link": fields[7],
                    "slots": [_slot_range(part) for part in fields[8:] if not part.startswith("[")],
                }
            )
        return rows

    def primary_ports(self) -> list[int]:
        """The primaries that serve slots now (failed ones excluded), by a live node's view."""
        return sorted(
            row["port"]
            for row in self.topology()
            if "master" in row["flags"] and row["slots"] and "fail" not in row["flags"] and "fail?" not in row["flags"]
        )

    def replicated_primaries(self) -> list[int]:
        """The serving primaries with a live replica (the ones that can fail over)."""
        rows = self.topology()
        live = set(self.live_ports())
        ids = {row["id"]: row["port"] for row in rows}
        backed = {ids.get(row["primary_id"]) for row in rows if "slave" in row["flags"] and row["port"] in live}
        return [port for port in self.primary_ports() if port in backed]

    def replicas_of(self, port: int) -> list[int]:
        """The live replicas of the primary `port`."""
        rows = self.topology()
        node_id = next(row["id"] for row in rows if row["port"] == port)
        return [row["port"] for row in rows if row["primary_id"] == node_id and row["port"] in self.live_ports()]

    def owner(self, slot: int) -> int:
        """The port of the primary that serves `slot`, by a live node's view."""
        for row in self.topology():
            if "master" in row["flags"] and any(low <= slot <= high for low, high in row["slots"]):
                return row["port"]
        raise ClusterError(f"no primary serves slot {slot}")

    def keys_per_primary(self, pattern: str = "*") -> dict[int, int]:
        """{primary port: keys matching `pattern` it holds}."""
        return {
            port: sum(1 for _ in self.client(port).scan_iter(match=pattern, count=1000))
            for port in self.primary_ports()
        }

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Until every live node says cluster_state:ok, every slot is served by a primary that is not
        failing, and every live replica's link to its primary is up (a replica that never synced
        could not take over)."""
        deadline = time.monotonic() + timeout_s

        def healthy() -> bool:
            ports = self.live_ports()
            for port in ports:
                info = _command(self.client(port), "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                    return False
                replication = self.client(port).info("replication")
                if replication["role"] == "slave" and replication.get("master_link_status") != "up":
                    return False
            rows = self.topology(ports[0])
            served = sum(
                high - low + 1
                for row in rows
                if "master" in row["flags"] and "fail" not in row["flags"]
                for low, high in row["slots"]
            )
            return served == 16384

        self._until(healthy, deadline, "the cluster did not become healthy")

    @staticmethod
    def _until(check: Callable[[], bool], deadline: float, message: str) -> None:
        while True:
            try:
                if check():
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(message)
            time.sleep(0.05)

    # -- faults -------------------------------------------------------------------------------------
    def _note_slots(self, port: int) -> None:
        rows = [row for row in self.topology() if row["port"] == port and row["slots"]]
        self.nodes[port].first_slot = rows[0]["slots"][0][0] if rows else None

    def kill(self, port: int) -> None:
        """SIGKILL: the node is gone (its replica takes over after the node timeout)."""
        self._note_slots(port)
        node = self.nodes[port]
        node.process.kill()
        node.process.wait()

    def hang(self, port: int) -> None:
        """SIGSTOP: the node accepts connections (the kernel's backlog) and answers nothing."""
        self._note_slots(port)
        self.nodes[port].process.send_signal(signal.SIGSTOP)
        self.nodes[port].hung = True

    def wait_failover(self, port: int, timeout_s: float = 60.0) -> int:
        """Until another primary (its promoted replica) serves the slots of the dead or hung
        primary `port` and the cluster is healthy again: that primary's port."""
        deadline = time.monotonic() + timeout_s
        slot = self.nodes[port].first_slot
        if slot is None:
            raise ClusterError(f"{port} served no slots when it was killed or hung")
        taken: list[int] = []

        def taken_over() -> bool:
            owner = self.owner(slot)
            taken.append(owner)
            return owner != port and owner in self.live_ports()

        self._until(taken_over, deadline, f"no replica took over from {port}")
        self.wait_healthy(deadline - time.monotonic())
        return taken[-1]

    def migrate_slot(
        self, slot: int, target: int, keys_first: int | None = None, between: Callable[[], object] | None = None
    ) -> None:
        """Moves `slot` to the primary `target`, as `redis-cli --cluster reshard` does: the slot
        marked importing on the target and migrating on its owner, its keys MIGRATEd, then the
        slot assigned to the target on every node. `keys_first`: migrate that many keys, call
        `between()` (clients meet ASK redirects for the moved keys meanwhile), then the rest."""
        source = self.owner(slot)
        if source == target:
            return
        ids = {row["port"]: row["id"] for row in self.topology()}
        src, dst = self.client(source), self.client(target)
        _command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        _command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        moved = 0
        while True:
            limit = 100 if keys_first is None or moved >= keys_first else keys_first - moved
            keys = _command(src, "CLUSTER", "GETKEYSINSLOT", slot, limit) if limit else []
            if keys:
                _command(src, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "REPLACE", "KEYS", *keys)
                moved += len(keys)
            if between is not None and (not keys or moved >= (keys_first or 0)):
                between()
                between = None
                continue
            if not keys:
                break
        # the target first, then the source (which then answers MOVED), then the other primaries
        for port in [target, source] + [p for p in self.primary_ports() if p not in (target, source)]:
            _command(self.client(port), "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
