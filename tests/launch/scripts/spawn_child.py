"""A worker that starts a child (its own process group, as a data loader or a shell tool might) and waits.

Writes ``<dir>/rank<RANK>.pids`` (its pid and the child's), then sleeps. No torch import: fast.
"""
import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
path = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pids")
with open(path + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {child.pid}\n")
os.replace(path + ".tmp", path)
time.sleep(300)
