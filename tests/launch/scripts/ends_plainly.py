"""A program that ends as a user's script does, with what the interpreter's end must still take care of.

    python -m convoy.launch.record ends_plainly.py OUT_FILE [--then exit3|message|raise] [--no-torch]

It writes to OUT_FILE and never closes it, starts a thread that outlives the program, registers an exit handler,
and leaves an object that only the end of the program's modules frees (it prints TEARDOWN). ``--then`` ends it with
``sys.exit(3)``, ``sys.exit("...")`` or an uncaught exception instead of returning; ``--no-torch`` never
imports ``torch.distributed``.
"""
import atexit
import sys
import threading
import time
import types

if "--no-torch" not in sys.argv:
    import torch.distributed  # noqa: F401


class FreedByTheTeardown:
    def __del__(self):
        print("TEARDOWN", flush=True)


holder = types.ModuleType("freed_by_the_teardown")  # a module's globals are freed at the end, not before
holder.keep = FreedByTheTeardown()
sys.modules[holder.__name__] = holder
OUT = open(sys.argv[1], "w")  # never closed
OUT.write("written, never flushed\n")
atexit.register(print, "the program's exit handler ran", flush=True)
threading.Thread(target=lambda: (time.sleep(0.3), print("the program's thread finished", flush=True))).start()
then = sys.argv[sys.argv.index("--then") + 1] if "--then" in sys.argv else "return"
if then == "exit3":
    sys.exit(3)
if then == "message":
    sys.exit("stopped with a message")
if then == "raise":
    raise RuntimeError("failed after the work")
