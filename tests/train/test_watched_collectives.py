"""The Accelerator's gather / gather_for_metrics / reduce / broadcast / pad_across_processes are watched like
wait_for_everyone: a rank that skips one is named within the collective timeout, and the job ends."""

import re
from pathlib import Path

import pytest

from tests.distributed import run_script

SCRIPT = Path(__file__).parent / "scripts" / "skipped_gather.py"


@pytest.mark.slow
def test_a_skipped_gather_names_the_missing_rank_and_ends_the_job():
    result = run_script(SCRIPT, nproc=2, timeout=90)
    out = result.output
    assert result.returncode != 0, out
    # watched collectives in step give the same results as unwatched ones
    assert "IN STEP rank 0" in out and "IN STEP rank 1" in out, out
    # ranks at different collectives: each is told who is where
    assert "MISMATCH rank 0: ranks are out of step at guarded collective #6: rank 0 is at 'gather'; " \
           "rank 1 is at 'reduce'" in out, out
    assert "MISMATCH rank 1:" in out, out
    # save_state called on the main process only: both ranks are told so at once, with what to do instead
    for rank in (0, 1):
        assert re.search(rf"MAIN ONLY rank {rank}: ranks are out of step at guarded collective #7: .*save_state\(\) "
                         r"is collective: call it on every process, not under `if accelerator.is_main_process:`",
                         out), out
    # the skipped gather: rank 0 gives up after Accelerator(collective_timeout=3) and names rank 1
    assert re.search(r"SKIPPED rank 0 after [\d.]+s: collective 'gather_for_metrics' \(#8\) did not complete "
                     r"within 3 s: rank 1 of 2 did not arrive", out), out
    # the job ended then: rank 1 was stopped in its 60 s sleep, and nobody ran past the skipped gather
    assert "RANK 1 WOKE UP" not in out and "NO TIMEOUT" not in out, out
