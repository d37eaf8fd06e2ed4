"""A program that fails and is sent SIGTERM while its failure is being reported, as torch's agent stops a rank that
was failing too (its peer gone) once another rank's failure was seen.

    TORCHELASTIC_ERROR_FILE=... python -m convoy.launch.record stopped_while_failing.py
"""
import os
import signal


class PeerGone(RuntimeError):
    def __str__(self) -> str:  # formatted once the report has begun: the agent's SIGTERM comes then
        os.kill(os.getpid(), signal.SIGTERM)
        return "Connection closed by peer"


def collective():
    raise PeerGone()


collective()
