"""Process helpers for the tests that launch torchrun or the Slurm script: a process's children
and its whole tree from /proc, a free localhost port, and stand-ins for Slurm's srun and scontrol."""

import os
import signal
import socket
from pathlib import Path


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's, from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (torchrun starts the ranks in sessions of their own)."""
    for child in children(pid):
        kill_tree(child)
    os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    """A localhost port free at the time of asking (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def fake_slurm_tools(bin_dir: Path, scontrol: str = "#!/bin/bash\necho localhost\n") -> None:
    """Write executable stand-ins for ``srun`` (drops its --options, runs the rest) and ``scontrol``
    (the given script; by default it names localhost as the job's only node) into ``bin_dir``."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(scontrol)
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
