"""Shared pytest configuration for the kraftlog suite.

Leak guard: every process and thread a test starts is stopped by that test (in a
`finally` or a fixture). The autouse fixture `no_leaked_processes_or_threads` fails the
test that leaves one running (error at teardown, naming the leak), then kills the leaked
processes so one failure does not slow every later test; `pytest_sessionfinish` does the
same for processes that outlive module and session fixtures.

A test's process is a descendant of pytest, or (for daemons started detached, such as
`kraftlog cluster up`, which init adopts) a process whose environment carries
`KRAFTLOG_TEST_SESSION` with this session's token. Processes below one that was already
running before the test (the Spark JVM's python workers, a module fixture's broker) belong
to that older process, not to the test.
"""
import os
import signal
import sys
import threading
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SESSION_ENV = "KRAFTLOG_TEST_SESSION"
SESSION_TOKEN = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
os.environ[SESSION_ENV] = SESSION_TOKEN   # inherited by every process the suite starts
_MARK = f"{SESSION_ENV}={SESSION_TOKEN}".encode()

leak_grace_s = 5.0   # a process or thread being stopped gets this long to go before it counts as leaked
# threads of thread pools (asyncio's default executor, concurrent.futures) that a closed
# loop lets go in its own time; they run no test code
_POOL_THREAD_PREFIXES = ("ThreadPoolExecutor-", "asyncio_")
# libraries whose threads serve the interpreter until it exits: py4j's callback server and
# its connections (started by the first Spark foreachBatch, then shared by the session)
_LIFETIME_THREAD_MODULES = ("py4j.",)

Proc = tuple[int, int]   # (pid, start time in clock ticks): a pid cannot be mistaken after reuse


def _process_table() -> dict[Proc, Proc | None]:
    """Every live process -> its parent (None when the parent is gone); zombies left out."""
    stat: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()   # after "pid (comm) "
        if fields[0] in (b"Z", b"X"):
            continue
        stat[int(name)] = (int(fields[1]), int(fields[19]))   # ppid, starttime
    table: dict[Proc, Proc | None] = {}
    for pid, (ppid, start) in stat.items():
        parent = (ppid, stat[ppid][1]) if ppid in stat else None
        table[(pid, start)] = parent
    return table


def _marked(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return _MARK in f.read().split(b"\0")
    except OSError:
        return False


def _self() -> Proc:
    with open("/proc/self/stat", "rb") as f:
        data = f.read()
    return os.getpid(), int(data[data.rindex(b")") + 2:].split()[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _interpreter_helpers(table: dict[Proc, Proc | None]) -> set[Proc]:
    """multiprocessing's resource tracker and fork server: started on first use, they serve
    the interpreter until it exits (what they start is still checked)."""
    pids = set()
    for mod, obj, attr in (("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
                           ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid")):
        pid = getattr(getattr(sys.modules.get(mod), obj, None), attr, None)
        if pid:
            pids.add(pid)
    return {p for p in table if p[0] in pids}


def _started_since(before: set[Proc]) -> list[Proc]:
    """Live processes of this test session that did not run in `before` and do not descend
    from a session process that did (those belong to an older fixture)."""
    me = _self()
    table = _process_table()
    helpers = _interpreter_helpers(table)
    ours: list[Proc] = []
    for proc in table:
        if proc in before or proc == me or proc in helpers:
            continue
        up = table.get(proc)
        while up is not None and (up in helpers or up not in before) and up != me:
            up = table.get(up)
        if up == me:
            ours.append(proc)
        elif (up is None or not _belongs_to_session(up, table, me)) and _marked(proc[0]):
            ours.append(proc)   # adopted by init (or a subreaper) but started by this session
    return ours


def _belongs_to_session(proc: Proc, table: dict, me: Proc) -> bool:
    up: Proc | None = proc
    while up is not None:
        if up == me:
            return True
        up = table.get(up)
    return _marked(proc[0])


def _kill(procs: list[Proc]) -> None:
    live = _process_table()
    for pid, start in procs:
        if (pid, start) in live:   # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _leaked_processes(before: set[Proc]) -> list[str]:
    deadline = time.monotonic() + leak_grace_s
    leaked = _started_since(before)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = _started_since(before)
    described = [f"pid {pid}: {_cmdline(pid)}" for pid, _ in leaked]
    _kill(leaked)
    return described


def _library_thread(t: threading.Thread) -> bool:
    if t.name.startswith(_POOL_THREAD_PREFIXES):
        return True
    module = getattr(getattr(t, "_target", None), "__module__", None) or type(t).__module__
    return module.startswith(_LIFETIME_THREAD_MODULES)


def _leaked_threads(before: set[threading.Thread]) -> list[str]:
    def alive():
        return [t for t in threading.enumerate()
                if t not in before and t.is_alive() and not _library_thread(t)]
    deadline = time.monotonic() + leak_grace_s
    leaked = alive()
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = alive()
    return [f"thread {t.name!r} (target {getattr(t, '_target', None)!r})" for t in leaked]


@pytest.fixture(autouse=True)
def no_leaked_processes_or_threads():
    """Fails the test that leaves a process or thread it started running (see the module
    docstring); autouse and function scoped, so it wraps every other function fixture."""
    me = _self()
    before = set(_process_table())
    before.discard(me)
    before_threads = set(threading.enumerate())
    yield
    leaks = _leaked_processes(before) + _leaked_threads(before_threads)
    if leaks:
        pytest.fail("the test left running what it started (stop it in a finally or a fixture): "
                    + "; ".join(leaks), pytrace=False)


def _spark_gateway() -> Proc | None:
    """The pyspark JVM lives as long as the Python process that launched it, by design."""
    ctx = sys.modules.get("pyspark.context")
    gw = getattr(getattr(ctx, "SparkContext", None), "_gateway", None) if ctx else None
    proc = getattr(gw, "proc", None)
    if proc is None or proc.poll() is not None:
        return None
    return next((p for p in _process_table() if p[0] == proc.pid), None)


# Tests that run alone (`make test`'s second phase, no other test beside them): their subject
# is timing under faults or load (chaos schedules, fencing and elections, the silence
# rules), they change the host's network (netns), or they load both cores themselves. The
# rest run two at a time (pytest-xdist, `-n 2`, first phase). A path prefix of tests/.
SERIAL_PATHS = (
    "tests/chaos/",
    "tests/unit/raft/",
    "tests/integration/test_netns_isolation.py",
    "tests/integration/test_availability_no_false_fencing.py",
    "tests/integration/test_controller_under_load.py",
    "tests/integration/test_partitions_at_scale.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SERIAL_PATHS):
            item.add_marker(pytest.mark.serial)


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput"):
        return   # pytest-xdist's controller runs no test: each worker checks what its own tests left
    gateway = _spark_gateway()
    before = {gateway} if gateway else set()
    leaked = _leaked_processes(before)
    if leaked:
        sys.stderr.write("\nprocesses still running after the session (killed now): " + "; ".join(leaked) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
