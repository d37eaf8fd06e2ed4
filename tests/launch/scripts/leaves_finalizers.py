"""A rank that leaves to the interpreter's end what ordinary scripts leave to it: each of these completes at
exit under ``torchrun`` and must under ``convoy launch`` too.

    convoy launch --devices 0 --nproc-per-node 2 leaves_finalizers.py OUT_DIR

Per rank, in OUT_DIR/rank<N>/: a gzip file and a zip archive never closed, a ``NamedTemporaryFile`` never closed
(its name in ``tempfile.txt``; it must be gone), a tqdm bar never closed (on stderr), an object
whose ``__del__`` writes ``del.txt``, a ``weakref.finalize`` that writes ``finalize.txt``, an exit handler that
writes ``atexit.txt``, a thread that writes ``thread.txt`` after the program ended, and an object kept in a
module of the program's own (``helper_module``) whose ``__del__`` writes ``module_del.txt``.
"""
import atexit
import gzip
import sys
import tempfile
import threading
import time
import weakref
import zipfile
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
import helper_module  # noqa: E402

dist.init_process_group("gloo")
OUT = Path(sys.argv[1]) / f"rank{dist.get_rank()}"
OUT.mkdir(parents=True, exist_ok=True)
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()


class WritesOnDel:
    def __init__(self, path):
        self.path = path

    def __del__(self):
        self.path.write_text("complete\n")


class Finalized:
    pass


GZ = gzip.open(OUT / "data.gz", "wt")
GZ.write("complete\n" * 1000)
ZIP = zipfile.ZipFile(OUT / "data.zip", "w")
ZIP.writestr("member.txt", "complete\n")
TEMP = tempfile.NamedTemporaryFile(prefix="convoy-finalizer-", delete=True)
(OUT / "tempfile.txt").write_text(TEMP.name)
BAR = tqdm(total=3000, mininterval=3600, ascii=True, desc=f"{OUT.name} bar")  # on stderr, as by default
for _ in range(3000):
    BAR.update()
DEL = WritesOnDel(OUT / "del.txt")
FINALIZED = Finalized()
weakref.finalize(FINALIZED, (OUT / "finalize.txt").write_text, "complete\n")
atexit.register((OUT / "atexit.txt").write_text, "complete\n")
helper_module.KEPT = WritesOnDel(OUT / "module_del.txt")
threading.Thread(target=lambda: (time.sleep(0.3), (OUT / "thread.txt").write_text("complete\n"))).start()
print(f"rank {OUT.name}: done", flush=True)
