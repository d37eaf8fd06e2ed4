"""A main thread inside a call that runs no signal handler, as torch's TCPStore constructor is, or in Python.

    python blocked.py c-call | python-loop | after-shut | full-stdout

``c-call`` reads a pipe nobody writes (a C call that runs no Python handler until it returns); ``python-loop``
sleeps in short steps, running handlers between them; ``after-shut`` shuts the gate first, as torch's agent
does when it starts workers, then reads the pipe; ``full-stdout`` writes to a stdout nobody reads (blocked
in the write, holding the stream) and says "waiting" on stderr. It prints "waiting" once inside, and "cleaned
up" when the block ends by an exception. SIGTERM and SIGHUP raise ``Terminated`` here, as in ``convoy launch``.
"""
import os
import signal
import sys
import time

from convoy.errors import Terminated
from convoy.launch.blocked_stop import StopGate, stoppable_while_blocked


def stop(signum, _frame):
    raise Terminated(signum)


for signum in (signal.SIGTERM, signal.SIGHUP):  # as the convoy command has them while it runs a job
    signal.signal(signum, stop)
how = sys.argv[1]
gate = StopGate()
never_written, keep = os.pipe()
try:
    with stoppable_while_blocked(gate):
        if how == "after-shut":
            gate.shut()
        print("waiting", flush=True, file=sys.stderr if how == "full-stdout" else sys.stdout)
        if how == "full-stdout":
            sys.stdout.write("x" * 10**7)
            sys.stdout.flush()
        if how == "python-loop":
            while True:
                time.sleep(0.05)
        os.read(never_written, 1)
except BaseException as stop:
    print(f"cleaned up after {type(stop).__name__}", flush=True)
    raise
