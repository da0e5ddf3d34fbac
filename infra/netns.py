"""Emulated cluster links for real processes: network namespaces on a bridge, shaped with tc.

``shaped_network(n, rate_mbit=R, delay_ms=D)`` builds, as root, this topology and removes it
on exit (also on error)::

    root namespace: bridge {prefix}-br, 10.77.0.1/24
        ├─ {prefix}-p0 ══ veth ══ {prefix}-h0  (in namespace {prefix}-h0)  10.77.0.2
        ├─ {prefix}-p1 ══ veth ══ {prefix}-h1  (in namespace {prefix}-h1)  10.77.0.3
        └─ ...                                                           10.77.0.(i+2)

**What is shaped.** Linux shapes what a device *sends* (its egress qdisc), so each host's link
is shaped at both of its ends:

* host i's *uplink* (what host i sends): egress of ``{prefix}-h{i}`` inside the namespace,
  ``tbf rate R`` — rate only, no delay;
* host i's *downlink* (what host i receives): egress of the bridge port ``{prefix}-p{i}`` in
  the root namespace, ``tbf rate R`` with, if ``D > 0``, a ``netem delay D`` child qdisc.

Every host therefore has a full-duplex link of ``R`` Mbit/s **in each direction**, and a packet
from host a to host b crosses a's uplink and b's downlink: it is limited to ``R`` (the second
limiter of equal rate adds nothing once the first one paces the flow) and delayed by ``D``
**once**. The parameters of :class:`damptune.netmodel.Network` are therefore

* bandwidth ``β = R`` per direction (``bandwidth_gbps = R / 1000``), and
* one-way host-to-host latency ``α = D`` (``latency_us = 1000 D``); a ping between two hosts
  shows a round trip of ``2 D``.

Traffic between the root namespace (the bridge address, e.g. a Dask scheduler) and host i gets
``R`` both ways, ``D`` towards the host and no delay from it.

What the emulation adds that a model with only ``α`` and ``β`` does not have (measured with a
bare gloo all-reduce between two namespaces, P=2, 2-core VM):

* Headers. tbf charges each packet its length at the qdisc: the Ethernet frame without
  preamble and FCS, i.e. 66 bytes of Ethernet, IPv4, TCP and TCP-timestamp headers per 1448-byte
  segment at MTU 1500 (a GSO packet is charged the headers of each of its segments). The
  payload rate is ``R · 1448/1514 ≈ 0.956 R``. A real Ethernet NIC also sends preamble, gap and
  FCS: ``R · 1448/1538 ≈ 0.941 R``. (5.75 MB at 200 Mbit/s: 239 ms measured, 230 ms for
  ``M/β``, 240.5 ms with the header factor, 237.7 ms with the bucket below as well.)
* The bucket. tbf's bucket is ``BURST_BYTES`` = 70 kB, one full GSO packet: the first ~70 kB
  after an idle period pass at once, so a transfer that follows a pause of at least
  ``70 kB / R`` saves that much time. The bucket cannot be much smaller: tbf then cuts every
  GSO packet into frames and needs one timer per frame, and on a busy 2-core VM late timers
  cost throughput (a 0.1 ms bucket gave 275 instead of 400 Mbit/s).
* The host. Without shaping, the same all-reduce of 1.15 MB takes ~1.5 ms here; keep
  ``M / R`` well above that (``R`` ≤ ~400 Mbit/s on such a machine).
* Delay and TCP Small Queues (not checked on the development VM, whose kernel has no netem):
  over veth the sending socket keeps ownership of a packet until the receiver's IP layer, so
  TSQ counts packets held by netem against its limit (about two GSO packets or 1 ms of pacing
  rate). Delays above ~1 ms may hold a TCP flow below ``R``.

Queues are long (``limit``) so that they never drop: a drop costs a TCP retransmission
timeout, which would dominate a measurement. The namespaces keep their default congestion
control (BBR on the development VM; ``congestion_control="cubic"`` sets another one per route,
as the sysctl is not writable inside a namespace there); both gave the same times.

Names are derived from ``prefix`` (at most 8 characters), and everything this module would
create under that prefix is removed first, so a leftover from a crashed run does not get in
the way. One process at a time may hold the 10.77.0.0/24 network (a lock file serializes
callers). Only addresses in 10.77.0.0/24, on devices created here, are used.

:func:`dask_on_network` starts a Dask scheduler on the bridge address (root namespace) and one
single-threaded Dask worker per namespace, with ``GLOO_SOCKET_IFNAME`` set to the namespace's
veth so that torch.distributed's gloo traffic goes over the shaped link (the hostname
resolves to 127.0.0.1 or to an address outside the namespace, which gloo would use otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BRIDGE_ADDRESS",
    "Host",
    "ShapedNetwork",
    "can_make_namespaces",
    "netem_available",
    "shaped_network",
    "reshape",
    "dask_on_network",
]

SUBNET = "10.77.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
MAX_HOSTS = 200
QUEUE_BYTES = 64 << 20  # tbf queue: never drop
QUEUE_PACKETS = 100_000  # netem queue: never drop
BURST_BYTES = 70_000  # tbf bucket: one full GSO packet (64 KiB + 45 sets of headers)
LOCK_FILE = Path(tempfile.gettempdir()) / "damptune-netns-10.77.0.lock"
REPO_ROOT = Path(__file__).resolve().parent.parent
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class Host:
    """One emulated host: a network namespace joined to the bridge by a veth pair."""

    index: int
    namespace: str
    address: str  # 10.77.0.(index + 2)
    ifname: str  # the veth end inside the namespace (its uplink qdisc; GLOO_SOCKET_IFNAME)
    port: str  # the veth end on the bridge, in the root namespace (its downlink qdisc)

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``; same PID once exec'd)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass(frozen=True)
class ShapedNetwork:
    """What :func:`shaped_network` built; ``bandwidth_gbps``/``latency_us`` are for the model."""

    prefix: str
    bridge: str
    address: str
    hosts: tuple[Host, ...]
    rate_mbit: float
    delay_ms: float

    @property
    def bandwidth_gbps(self) -> float:
        """Per-direction bandwidth β of every host's link (``Network.bandwidth_gbps``)."""
        return self.rate_mbit / 1000.0

    @property
    def latency_us(self) -> float:
        """One-way host-to-host latency α (``Network.latency_us``)."""
        return self.delay_ms * 1000.0

    def describe(self) -> str:
        return (f"{len(self.hosts)} namespaces on bridge {self.bridge} ({self.address}); every "
                f"host link {self.rate_mbit:g} Mbit/s per direction, one-way delay "
                f"{self.delay_ms:g} ms host to host")


# -- commands ----------------------------------------------------------------------------------
def _run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _names(prefix: str, n_hosts: int) -> tuple[str, list[tuple[str, str, str]]]:
    bridge = f"{prefix}-br"
    return bridge, [(f"{prefix}-h{i}", f"{prefix}-h{i}", f"{prefix}-p{i}") for i in range(n_hosts)]


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _ours(name: str, prefix: str) -> bool:
    return re.fullmatch(rf"{re.escape(prefix)}-(br|h\d+|p\d+)", name) is not None


def _remove_all(prefix: str) -> list[str]:
    """Delete every link and namespace named after ``prefix``; return what could not be."""
    errors = []
    for link in _links():  # the bridge ports first: deleting one end deletes its pair
        if _ours(link, prefix) and not link.endswith("-br"):
            with contextlib.suppress(RuntimeError):
                _run(["ip", "link", "del", link])
    for kind, names in (("link", _links()), ("netns", _namespaces())):
        for name in names:
            if _ours(name, prefix):
                try:
                    _run(["ip", kind, "del", name])
                except RuntimeError as exc:
                    errors.append(str(exc))
    return errors


def _check_subnet_free(prefix: str) -> None:
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3].startswith(f"{SUBNET}.") and not _ours(parts[1], prefix):
            raise RuntimeError(f"{SUBNET}.0/24 is already in use on device {parts[1]} "
                               f"({parts[3]}); not touching it")


@contextlib.contextmanager
def _subnet_lock(timeout: float) -> Iterator[None]:
    with open(LOCK_FILE, "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{SUBNET}.0/24 is held by another process "
                                       f"(lock {LOCK_FILE}) for more than {timeout:g} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shape(in_ns: list[str], dev: str, rate_mbit: float, delay_ms: float) -> None:
    """Egress of ``dev``: tbf at ``rate_mbit``, and a netem ``delay_ms`` inside it if > 0."""
    _run([*in_ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)  # and any child
    _run([*in_ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
          f"{rate_mbit:g}mbit", "burst", str(BURST_BYTES), "limit", str(QUEUE_BYTES)])
    if delay_ms > 0:
        _run([*in_ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:",
              "netem", "delay", f"{delay_ms:g}ms", "limit", str(QUEUE_PACKETS)])


def _probe(shape: Callable[[str], None]) -> tuple[bool, str]:
    """Make a throwaway namespace with a veth pair into it, call ``shape(port)``, clean up."""
    tag = f"{os.getpid() % 100000}"
    ns, port, inner = f"dtprobe{tag}", f"dtq{tag}", f"dtr{tag}"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns])
        shape(port)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    finally:
        _run(["ip", "link", "del", port], check=False)
        _run(["ip", "netns", "del", ns], check=False)
    return True, ""


# -- public API --------------------------------------------------------------------------------
def can_make_namespaces() -> tuple[bool, str]:
    """Whether :func:`shaped_network` can work here: (True, "") or (False, why not).

    Needs root, ``ip`` and ``tc``, and tries what it needs: a namespace, a veth pair into it
    and a tbf qdisc (then deletes them). Delays need netem as well: :func:`netem_available`.
    """
    if sys.platform != "linux":
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces and tc need root (euid is not 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not installed"
    ok, why = _probe(lambda port: _shape([], port, 100.0, 0.0))
    if not ok:
        return False, f"cannot create a namespace, a veth pair and a tbf qdisc: {why}"
    return True, ""


def netem_available() -> tuple[bool, str]:
    """Whether tc's netem qdisc (needed for ``delay_ms > 0``) exists: (True, "") or why not."""
    ok, why = can_make_namespaces()
    if not ok:
        return False, why
    ok, why = _probe(lambda port: _shape([], port, 100.0, 1.0))
    if not ok:
        return False, f"the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): {why}"
    return True, ""


@contextlib.contextmanager
def shaped_network(
    n_hosts: int,
    *,
    rate_mbit: float,
    delay_ms: float,
    prefix: str = "dt",
    congestion_control: str | None = None,
    lock_timeout: float = 120.0,
) -> Iterator[ShapedNetwork]:
    """``n_hosts`` namespaces on a bridge, every host link shaped (see the module docstring).

    Yields a :class:`ShapedNetwork`; removes namespaces, veths and bridge on exit (processes
    still inside a namespace are ended by PID first). Raises RuntimeError if it cannot be built
    (``delay_ms > 0`` without netem, 10.77.0.0/24 used by a device not made here, ...).
    ``congestion_control`` (e.g. ``"cubic"``) sets the TCP congestion control of the hosts'
    routes; None keeps the kernel's default.
    """
    _check_network_request(n_hosts, rate_mbit=rate_mbit, delay_ms=delay_ms, prefix=prefix)
    bridge, names = _names(prefix, n_hosts)
    with _subnet_lock(lock_timeout):
        leftovers = _remove_all(prefix)
        if leftovers:
            raise RuntimeError("cannot remove a leftover network: " + "; ".join(leftovers))
        _check_subnet_free(prefix)
        hosts: list[Host] = []
        try:
            _run(["ip", "link", "add", bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", bridge])
            _run(["ip", "link", "set", bridge, "up"])
            for i, (ns, inner, port) in enumerate(names):
                host = Host(i, ns, f"{SUBNET}.{i + 2}", inner, port)
                _run(["ip", "netns", "add", ns])
                hosts.append(host)
                _add_host(host, bridge, rate_mbit=rate_mbit, delay_ms=delay_ms,
                          congestion_control=congestion_control)
            yield ShapedNetwork(prefix, bridge, BRIDGE_ADDRESS, tuple(hosts), rate_mbit, delay_ms)
        finally:
            for host in hosts:
                _end_processes_in(host.namespace)
            errors = _remove_all(prefix)
            if errors:
                print("infra.netns: cleanup incomplete: " + "; ".join(errors), file=sys.stderr)


def _check_network_request(n_hosts: int, *, rate_mbit: float, delay_ms: float,
                           prefix: str) -> None:
    """Refuse what :func:`shaped_network` cannot build, before it touches anything."""
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix {prefix!r}: 1-8 characters [a-z0-9], starting with a letter")
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise ValueError(f"n_hosts={n_hosts}: between 1 and {MAX_HOSTS}")
    if not (rate_mbit > 0 and delay_ms >= 0):
        raise ValueError(f"rate_mbit={rate_mbit}, delay_ms={delay_ms}: need rate > 0, delay >= 0")
    ok, why = can_make_namespaces()
    if not ok:
        raise RuntimeError(why)
    if delay_ms > 0:
        ok, why = netem_available()
        if not ok:
            raise RuntimeError(f"delay_ms={delay_ms:g} needs netem: {why}")


def _add_host(host: Host, bridge: str, *, rate_mbit: float, delay_ms: float,
              congestion_control: str | None) -> None:
    """The host's veth pair (one end on the bridge, one in its namespace), addressed and
    shaped: the downlink gets rate and delay, the uplink rate only."""
    ns, inner, port = host.namespace, host.ifname, host.port
    _run(["ip", "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns])
    _run(["ip", "link", "set", port, "master", bridge])
    _run(["ip", "link", "set", port, "up"])
    _shape([], port, rate_mbit, delay_ms)  # downlink: rate and delay
    in_ns = ["ip", "netns", "exec", ns]
    _run([*in_ns, "ip", "link", "set", "lo", "up"])
    _run([*in_ns, "ip", "addr", "add", f"{host.address}/24", "dev", inner])
    _run([*in_ns, "ip", "link", "set", inner, "up"])
    if congestion_control:  # per route: the sysctl is not writable in a netns
        _run([*in_ns, "ip", "route", "replace", f"{SUBNET}.0/24", "dev", inner,
              "proto", "kernel", "scope", "link", "src", host.address,
              "congctl", congestion_control])
    _shape(in_ns, inner, rate_mbit, 0.0)  # uplink: rate only


def reshape(net: ShapedNetwork, *, rate_mbit: float, delay_ms: float) -> ShapedNetwork:
    """Change the rate and delay of every link of ``net`` in place; return the new description.

    Processes, addresses and open connections stay; only the qdiscs are replaced.
    """
    if not (rate_mbit > 0 and delay_ms >= 0):
        raise ValueError(f"rate_mbit={rate_mbit}, delay_ms={delay_ms}: need rate > 0, delay >= 0")
    if delay_ms > 0:
        ok, why = netem_available()
        if not ok:
            raise RuntimeError(f"delay_ms={delay_ms:g} needs netem: {why}")
    for host in net.hosts:
        _shape([], host.port, rate_mbit, delay_ms)
        _shape(["ip", "netns", "exec", host.namespace], host.ifname, rate_mbit, 0.0)
    return dataclasses.replace(net, rate_mbit=rate_mbit, delay_ms=delay_ms)


def _end_processes_in(namespace: str, grace: float = 5.0) -> None:
    """End, by PID, the processes left in a namespace that :func:`shaped_network` created."""
    pids = [int(p) for p in _run(["ip", "netns", "pids", namespace], check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours still answers kill(0); reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    return True


# -- Dask on the network -----------------------------------------------------------------------
def _stop(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM to all of ``procs`` at once, SIGKILL to those still alive after ``grace``."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@contextlib.contextmanager
def dask_on_network(
    net: ShapedNetwork,
    *,
    python: str | None = None,
    workdir: str | os.PathLike[str] | None = None,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A Dask scheduler on the bridge address and one worker per host; yields its address.

    The scheduler runs in the root namespace (``dask_scheduler --host 10.77.0.1``), worker i in
    namespace i (``dask_worker --host 10.77.0.(i+2) --nthreads 1 --no-nanny``) with
    ``OMP_NUM_THREADS=1`` and ``GLOO_SOCKET_IFNAME`` set to its veth, so that gloo binds to
    the shaped link (by default gloo uses the address the hostname resolves to, which is not
    in the namespace). Waits until all workers are connected; stops them by PID on exit.
    """
    python = python or sys.executable
    own_dir = tempfile.mkdtemp(prefix="dask-netns-") if workdir is None else None
    root = Path(workdir or own_dir or ".")
    root.mkdir(parents=True, exist_ok=True)
    procs = _Processes(_process_env(env))
    try:
        deadline = time.monotonic() + timeout
        address = _start_scheduler(procs, python, net.address, root, deadline, timeout)
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for host in net.hosts:
            directory = root / f"worker-{host.index}"
            directory.mkdir(exist_ok=True)
            procs.start(host.exec_argv([
                python, "-m", "distributed.cli.dask_worker", address, "--host", host.address,
                "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name",
                f"host{host.index}", "--death-timeout", "60", "--local-directory",
                str(directory)]), root / f"worker-{host.index}.log",
                {**threads, "GLOO_SOCKET_IFNAME": host.ifname})
        _wait_for_workers(procs, address, net, deadline, timeout)
        yield address
    finally:
        _stop(procs.procs[1:])  # the workers, then the scheduler
        _stop(procs.procs[:1])
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


def _process_env(env: Mapping[str, str] | None) -> dict[str, str]:
    out = {**os.environ, **(env or {})}
    # gloo builds with a shared-memory all-reduce take it when LOCAL_WORLD_SIZE == group size,
    # which would bypass the links
    out.pop("LOCAL_WORLD_SIZE", None)
    out["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), out.get("PYTHONPATH", "")) if p)
    return out


class _Processes:
    """The processes :func:`dask_on_network` started, and their logs (for error messages)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, argv: list[str], log: Path, extra: dict[str, str]) -> subprocess.Popen:
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                    env={**self.env, **extra}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def failure(self, what: str) -> RuntimeError:
        tails = "\n".join(f"--- {log.name}\n{_tail(log)}" for log in self.logs)
        return RuntimeError(f"{what}\n{tails}")


def _start_scheduler(procs: _Processes, python: str, host: str, root: Path, deadline: float,
                     timeout: float) -> str:
    """A Dask scheduler on ``host`` (root namespace); its address once it wrote it."""
    scheduler_file = root / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    scheduler = procs.start(
        [python, "-m", "distributed.cli.dask_scheduler", "--host", host, "--port", "0",
         "--no-dashboard", "--scheduler-file", str(scheduler_file)], root / "scheduler.log", {})
    while True:
        if scheduler.poll() is not None:
            raise procs.failure("the Dask scheduler exited")
        if time.monotonic() > deadline:
            raise procs.failure(f"the Dask scheduler did not start within {timeout:g} s")
        with contextlib.suppress(OSError, ValueError, KeyError):
            return str(json.loads(scheduler_file.read_text())["address"])
        time.sleep(0.1)


def _wait_for_workers(procs: _Processes, address: str, net: ShapedNetwork, deadline: float,
                      timeout: float) -> None:
    """Every host's worker connected, each from its own address."""
    from distributed import Client

    with Client(address, timeout=f"{timeout:g}s", set_as_default=False) as client:
        try:
            client.wait_for_workers(len(net.hosts), timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            raise procs.failure(f"not all {len(net.hosts)} Dask workers connected within "
                                f"{timeout:g} s") from None
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    expected = {h.address for h in net.hosts}
    seen = {w.split("://")[-1].rsplit(":", 1)[0] for w in workers}
    if seen != expected:
        raise procs.failure(f"workers at {sorted(seen)}, expected {sorted(expected)}")
