"""How a leader reaches its followers: emulated in-process links, gRPC connections to listening followers,
and follower processes started on this machine (``sluice split party --role follower`` over loopback).

Every function here closes what it opened when it fails, so a failed start leaves no link or process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from sluice.errors import ConfigError, TransportError
from sluice.transport.emulated import emulated_pair
from sluice.transport.grpc_link import TlsFiles, connect
from sluice.transport.link import Link

from .config import SplitConfig, TlsConfig


def tls_files(t: TlsConfig) -> TlsFiles | None:
    if not t.enabled:
        return None
    assert t.cert is not None and t.key is not None
    return TlsFiles(t.cert, t.key, t.ca, t.server_name)


def emulated_links(cfg: SplitConfig, names: list[str]) -> tuple[dict[str, Link], list[Link]]:
    """One emulated link per follower (``transport.emulate``): (leader ends by name, follower ends)."""
    em = cfg.transport.emulate
    bw = None if em.bandwidth_mbps is None else em.bandwidth_mbps * 1e6
    ours: dict[str, Link] = {}
    theirs: list[Link] = []
    for name in names:
        a, b = emulated_pair(bw, em.latency_ms / 1000.0, em.burst_bytes, names=("leader", name))
        ours[name] = a
        theirs.append(b)
    return ours, theirs


def not_a_client_certificate(t: TlsConfig) -> str:
    """Why a follower that checks its leader refuses this leader's certificate, or '' when nothing says so:
    it names a purpose (extended key usage) and client authentication is not one of them, as for a
    follower's server certificate. The follower logs "unsupported certificate purpose"; the leader only sees
    that it could not connect. Needs ``cryptography`` (else '')."""
    if not t.enabled or not t.cert:
        return ""
    try:
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID
    except ImportError:
        return ""
    try:
        cert = x509.load_pem_x509_certificate(Path(t.cert).read_bytes())
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except (OSError, ValueError, x509.ExtensionNotFound):
        return ""
    if usages & {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE}:
        return ""
    return (f"{t.cert} is not a client certificate (a follower's server certificate?): a follower refuses it "
            "(\"unsupported certificate purpose\" in its log); give the leader its own, which `sluice certs DIR "
            "--follower ADDR` makes as DIR/leader/leader.pem (see examples/split_party_leader.toml)")


def connect_followers(cfg: SplitConfig, names: list[str], addresses: list[str]) -> dict[str, Link]:
    """A gRPC link to each listening follower, in order (all closed again if one cannot be reached). A
    failure to connect with a certificate that is not a client certificate says so."""
    if len(addresses) != len(names):
        raise ConfigError(
            f"config says followers = {len(names)} but {len(addresses)} addresses were given; give one "
            "--connect ADDR per follower"
        )
    links: dict[str, Link] = {}
    try:
        for name, addr in zip(names, addresses, strict=True):
            links[name] = connect(addr, cfg.transport.connect_timeout_s, tls_files(cfg.transport.tls), "leader")
    except BaseException as exc:
        for link in links.values():
            link.close()
        why = not_a_client_certificate(cfg.transport.tls) if isinstance(exc, TransportError) else ""
        if why:
            raise TransportError(f"{exc}; {why}") from exc
        raise
    return links


def _leave_sigint_to_the_leader() -> None:
    """In a follower process before it runs Python: ignore SIGINT (inherited across exec, so Python installs
    no KeyboardInterrupt handler). Ctrl-C in a terminal signals the whole process group; the leader cancels
    after its current step and then stops its followers, which must still be serving that step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _CpuWatch:
    """Whether a process is still on its way: since the watch began, it has run less than ``cpu_s`` seconds of
    CPU (counted from its start with ``from_start``), and it ran at some point in the last ``idle_s`` seconds.
    Starting and ending cost a process a few CPU seconds (importing, then tearing down, Python, torch and the
    task's modules) whatever the machine's load, while their wall time grows with the processes it shares the
    cores with; a process that does not run at all is waiting for something, or stuck."""

    def __init__(self, pid: int, cpu_s: float, idle_s: float, from_start: bool = False) -> None:
        import psutil

        self.cpu_s, self.idle_s = cpu_s, idle_s
        self.proc: psutil.Process | None = None
        self.base = self.used = 0.0
        self.ran_at = time.monotonic()
        try:
            self.proc = psutil.Process(pid)
            self.base = 0.0 if from_start else self._cpu()
        except psutil.Error:  # it ended already: its exit status says why
            self.proc = None
        self.used = self.base

    def _cpu(self) -> float:
        assert self.proc is not None
        t = self.proc.cpu_times()
        return t.user + t.system

    def stuck(self) -> str:
        """Why the process is not on its way ("" while it is, or once it has ended)."""
        import psutil

        if self.proc is None:
            return ""
        try:
            used = self._cpu()
        except psutil.Error:
            return ""
        if used > self.used:
            self.used, self.ran_at = used, time.monotonic()
        if self.used - self.base > self.cpu_s:
            return f"after {self.used - self.base:.0f} s of CPU time"
        if time.monotonic() - self.ran_at > self.idle_s:
            return f"and ran no CPU time for {self.idle_s:g} s"
        return ""


class FollowerProcesses:
    """One ``sluice split party --role follower`` process per follower, listening on
    ``transport.listen``; each gets the resolved config as ``party.toml`` in ``workdir`` and logs to
    ``follower-N.log`` there. They stay in this process's group but leave SIGINT (Ctrl-C) to it; they die
    with this process on Linux, and :meth:`stop` ends every one.

    A follower that has not started listening after ``transport.connect_timeout_s`` + 30 s of its own CPU
    time, or that ran no CPU time for that long, is an error: its start is timed in the CPU time it used, not
    in wall time, which a machine busy with other processes stretches without bound (so the followers wait for
    the leader to connect as long as ``--accept-timeout`` says by default: the leader connects once every one
    of them listens)."""

    def __init__(self, cfg: SplitConfig, names: list[str], workdir: Path) -> None:
        import tomli_w

        from sluice.config import toml_ready

        self.procs: list[subprocess.Popen] = []
        self.logs: list[IO[str]] = []
        self.addresses: list[str] = []
        workdir.mkdir(parents=True, exist_ok=True)
        cfg_path = workdir / "party.toml"
        cfg_path.write_text(tomli_w.dumps(toml_ready(cfg.model_dump())))
        wait = cfg.transport.connect_timeout_s + 30.0
        try:
            ready = []
            for name in names:
                rf = workdir / f"{name}.addr"
                rf.unlink(missing_ok=True)
                log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 - closed by stop()
                self.logs.append(log)
                cmd = [
                    sys.executable, "-m", "sluice", "split", "party", "--role", "follower",
                    "--listen", cfg.transport.listen, "--name", name, "--ready-file", str(rf),
                    "--parent-pid", str(os.getpid()), str(cfg_path),
                ]  # fmt: skip
                env = dict(os.environ)
                env.setdefault("OMP_NUM_THREADS", "1")
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                   preexec_fn=_leave_sigint_to_the_leader))
                ready.append(rf)
            for p, rf, name in zip(self.procs, ready, names, strict=True):
                watch = _CpuWatch(p.pid, wait, wait, from_start=True)
                while not rf.exists():
                    if p.poll() is not None:
                        tail = (workdir / f"{name}.log").read_text()[-2000:]
                        raise TransportError(f"{name} exited with status {p.returncode} before listening:\n{tail}")
                    why = watch.stuck()
                    if why:
                        raise TransportError(f"{name} did not start listening {why}")
                    time.sleep(0.05)
                self.addresses.append(rf.read_text().strip())
        except BaseException:
            self.stop(0.0)
            raise

    def stop(self, grace_s: float = 10.0) -> None:
        """Let the processes end by themselves while each is on its way (it ran within the last ``grace_s``
        seconds, and for less than ``grace_s`` seconds of CPU time since ``stop`` began), then terminate (and
        kill) the rest. A follower that said goodbye still tears its interpreter down (about a second of CPU),
        which takes many times longer on a busy machine; one left waiting for its peer runs no CPU."""
        watches = [_CpuWatch(p.pid, grace_s, grace_s) for p in self.procs]
        for p, watch in zip(self.procs, watches, strict=True):
            while p.poll() is None and not watch.stuck():
                try:
                    p.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + 3.0
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5.0)
        for log in self.logs:
            log.close()
