"""A one-node SLURM cluster for the tests, started from Debian's packages as root.

`start` writes its configuration under a temporary directory and starts, each in the
foreground as a child of the test process: munged (its own key and socket), MariaDB and
slurmdbd (accounting: `sacct` and submitit's job states read it), slurmctld and slurmd
(one node with this machine's CPUs and memory). Nothing outside that directory is read
or written but free TCP ports on 127.0.0.1, so a machine's own SLURM or MariaDB is left
alone. The client tools find the cluster through `SLURM_CONF`, which `Cluster.env` sets;
jobs inherit it (sbatch exports the environment), so submitit's `scontrol requeue` from
inside a job reaches the same controller.

`missing` says why a cluster cannot be started here (not root, a package not installed):
the tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = "slurm-wlm slurmdbd munge mariadb-server"
DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo", "sacct", "scontrol", "scancel", "mariadb")
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
START_S = 90
"""How long the daemons get to bring the node up."""


def missing() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "a SLURM cluster's daemons start as root, and the tests do not run as root"
    absent = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b, path=SEARCH) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed (scripts/setup.sh installs Debian's {PACKAGES} "
            "as root)"
        )
    return None


@dataclass
class Cluster:
    """A running cluster: `run` a client command against it."""

    dir: Path
    node: str
    cpus: int
    env: dict[str, str]
    daemons: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> str:
        result = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
        return result.stdout

    def logs(self) -> str:
        """The end of every daemon's log, for a failure's message."""
        tails = []
        for log in sorted(self.dir.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    def stop(self) -> None:
        """Cancels what still runs, then stops the daemons, last started first."""
        if self.daemons:
            self.run("scancel", "--user=root", check=False)
        for _, daemon in reversed(self.daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self.daemons.clear()


class NotStarted(RuntimeError):
    """A daemon exited at start: this machine cannot run it (a container without the
    permissions a daemon needs, say)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10  # slurmd refuses a node over its own
    raise RuntimeError("no MemTotal in /proc/meminfo")


def start(root: Path) -> Cluster:
    """A cluster whose files are under `root`, its node idle; `NotStarted` where a daemon
    exits at start, `TimeoutError` where the node does not come up."""
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    ports = {name: _free_port() for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd")}
    munge = root / "munge.socket"
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    env["PATH"] = SEARCH
    cluster = Cluster(root, node, cpus, env)
    for sub in ("ctld", "spool", "db", "munge"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    auth = f"AuthType=auth/munge\nAuthInfo=socket={munge}"
    (root / "slurm.conf").write_text(
        f"ClusterName=specbeam\nSlurmctldHost={node}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n"
        # A requeued job waits out its credential's lifetime (120 s unless cred_expire).
        f"{auth},cred_expire=10\nCredType=cred/munge\n"
        f"SlurmctldPort={ports['slurmctld']}\nSlurmdPort={ports['slurmd']}\n"
        f"StateSaveLocation={root / 'ctld'}\nSlurmdSpoolDir={root / 'spool'}\n"
        f"SlurmctldPidFile={root / 'slurmctld.pid'}\nSlurmdPidFile={root / 'slurmd.pid'}\n"
        f"SlurmctldLogFile={root / 'slurmctld.log'}\nSlurmdLogFile={root / 'slurmd.log'}\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU_Memory\n"
        "JobRequeue=1\nKillWait=5\nMinJobAge=600\nReturnToService=2\nMpiDefault=none\n"
        "SchedulerParameters=sched_interval=2\n"
        "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePass={munge}\nMailProg=/bin/true\n"
        f"AccountingStoragePort={ports['slurmdbd']}\nJobAcctGatherType=jobacct_gather/none\n"
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN\n"
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP\n"
    )
    dbd_conf = root / "slurmdbd.conf"
    dbd_conf.write_text(
        f"{auth}\nDbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={ports['slurmdbd']}\n"
        f"SlurmUser=root\nPidFile={root / 'slurmdbd.pid'}\nLogFile={root / 'slurmdbd.log'}\n"
        "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
        f"StoragePort={ports['mariadb']}\nStorageUser=slurm\nStorageLoc=slurm_acct_db\n"
    )
    dbd_conf.chmod(0o600)
    db_socket = root / "mariadb.socket"
    try:
        subprocess.run(
            ["mariadb-install-db", "--user=root", f"--datadir={root / 'db'}",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            env=env, capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        _spawn(cluster, "munged", "-F", "--force", f"--socket={munge}", f"--key-file={key}",
               f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munged.pid'}",
               f"--seed-file={root / 'munge' / 'seed'}")  # fmt: skip
        _spawn(cluster, "mariadbd", "--no-defaults", "--user=root", f"--datadir={root / 'db'}",
               f"--socket={db_socket}", "--bind-address=127.0.0.1", f"--port={ports['mariadb']}",
               f"--log-error={root / 'mariadb.log'}", f"--pid-file={root / 'mariadb.pid'}")  # fmt: skip
        _wait(cluster, "mariadb", lambda: db_socket.exists())
        grant = (
            "CREATE USER 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        cluster.run("mariadb", f"--socket={db_socket}", "-u", "root", "-e", grant)
        _spawn(cluster, "slurmdbd", "-D")  # slurmdbd.conf beside SLURM_CONF
        _wait(cluster, "slurmdbd", lambda: _listening(ports["slurmdbd"]))
        _spawn(cluster, "slurmctld", "-D", "-i")
        _spawn(cluster, "slurmd", "-D", "-N", node)
        _wait(cluster, "the node", lambda: _idle(cluster))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _spawn(cluster: Cluster, daemon: str, *args: str) -> None:
    log = open(cluster.dir / f"{daemon}.out", "wb")  # noqa: SIM115 (the daemon's, kept open)
    proc = subprocess.Popen(
        [daemon, *args], env=cluster.env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    cluster.daemons.append((daemon, proc))


def _wait(cluster: Cluster, what: str, ready) -> None:  # noqa: ANN001
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        for name, proc in cluster.daemons:
            if proc.poll() is not None:
                out = (cluster.dir / f"{name}.out").read_text(errors="replace")[-2000:]
                raise NotStarted(f"{name} exited with code {proc.returncode}: {out.strip()}")
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {START_S} s\n{cluster.logs()}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _idle(cluster: Cluster) -> bool:
    try:
        states = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
    except subprocess.TimeoutExpired:
        return False
    return f"{cluster.node} idle" in states
