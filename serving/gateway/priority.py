"""CPU priority for the gateway process: `cpu_nice` in the config.

With the kernel's autogroup scheduling on (`/proc/sys/kernel/sched_autogroup_enabled`, Linux's default for
desktop and many server kernels), the CPU is shared between sessions first, and a process's nice value only ranks
it against the other processes of its own session. So a gateway started in its own session (`setsid`, as a service
manager does) is ranked against vLLM's session by the session's autogroup nice (`/proc/self/autogroup`), which a
session leader can set for itself. A gateway that shares a session with other work gets the process nice only:
writing the group's nice would change theirs too.
"""

from __future__ import annotations

import os
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def apply_cpu_nice(nice: int) -> list[str]:
    """Set this process's nice and, as a session leader, its autogroup's. Returns warnings for what could not be
    done (a negative value needs root or CAP_SYS_NICE); the gateway runs on either way."""
    if not nice:
        return []
    warnings = []
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        warnings.append(
            f"cpu_nice {nice}: not permitted (needs root or CAP_SYS_NICE); the gateway runs at nice "
            f"{os.getpriority(os.PRIO_PROCESS, 0)}"
        )
        return warnings
    if not AUTOGROUP.exists():  # autogroup scheduling not built in: the process nice is all there is
        return warnings
    if os.getsid(0) != os.getpid():
        warnings.append(
            f"cpu_nice {nice}: set on the process only; with autogroup scheduling it ranks the gateway "
            "just within its session. Start it in its own session (setsid) for the nice to count "
            "against vLLM"
        )
        return warnings
    try:
        AUTOGROUP.write_text(str(nice))
    except PermissionError:
        warnings.append(f"cpu_nice {nice}: the session's autogroup nice is not permitted (needs root)")
    return warnings


def lower_session_priority(session_id: int, nice: int) -> None:
    """Run a session we started (e.g. a vLLM engine's, `setsid`) at `nice` > 0: its autogroup and every thread of
    its processes (Linux keeps a nice per thread). Raising a nice needs no privilege; the engine then yields the
    cores to a gateway that needs them."""
    if nice <= 0:
        return
    for thread in _session_threads(session_id):
        try:
            os.setpriority(os.PRIO_PROCESS, thread, nice)
        except (ProcessLookupError, PermissionError):  # it ended meanwhile / a lower nice we may not undo
            pass
    autogroup = Path(f"/proc/{session_id}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))


def _session_threads(session_id: int) -> list[int]:
    threads = []
    for process in Path("/proc").iterdir():
        try:
            if process.name.isdigit() and os.getsid(int(process.name)) == session_id:
                threads += [int(task.name) for task in (process / "task").iterdir()]
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            pass
    return threads


def current_cpu_nice() -> dict:
    """What the process runs at now: its nice and its autogroup's (None without autogroup scheduling)."""
    autogroup = None
    try:
        autogroup = int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup_nice": autogroup}
