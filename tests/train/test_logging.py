"""Rank-aware logging and progress bars, driven by the RANK/WORLD_SIZE a launcher sets."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from convoy.errors import ConfigError
from convoy.train import progress
from convoy.train.logging import get_logger, is_main_process, process_rank, world_size
from tests import processes
from tests.distributed import cpu_env, run_script


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.DEBUG, logger="convoy.test")
    return caplog


def _as_rank(monkeypatch, rank, size=2):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(size))


def test_main_process_only_by_default(monkeypatch, logged):
    logger = get_logger("convoy.test")
    _as_rank(monkeypatch, 1)
    logger.info("from one")
    logger.warning("every %s", "rank", main_process_only=False)
    _as_rank(monkeypatch, 0)
    logger.info("from zero %d", 0)
    assert [r.getMessage() for r in logged.records] == ["[rank1]: every rank", "from zero 0"]


def test_single_process_has_no_prefix(monkeypatch, logged):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    get_logger("convoy.test").error("plain", main_process_only=False)
    assert logged.records[-1].getMessage() == "plain"
    assert (process_rank(), world_size(), is_main_process()) == (0, 1, True)


def test_levels_from_argument_and_environment(monkeypatch, caplog):
    caplog.set_level(logging.NOTSET)
    monkeypatch.setenv("CONVOY_LOG_LEVEL", "warning")
    logger = get_logger("convoy.test.levels")
    logger.info("hidden")
    logger.warning("shown")
    assert [r.getMessage() for r in caplog.records if r.name == "convoy.test.levels"] == ["shown"]
    assert get_logger("convoy.test.levels", log_level="DEBUG").logger.level == logging.DEBUG
    with pytest.raises(ConfigError, match=r"get_logger\(log_level=...\): 'loud' is not valid; expected one of debug"):
        get_logger("convoy.test.levels", log_level="loud")
    monkeypatch.setenv("CONVOY_LOG_LEVEL", "critical")  # every level of Python's logging, as convoy.toml takes
    assert get_logger("convoy.test.levels").logger.level == logging.CRITICAL
    monkeypatch.setenv("CONVOY_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="environment CONVOY_LOG_LEVEL: 'loud' is not valid"):
        get_logger("convoy.test.levels")


def test_exception_keeps_the_traceback(logged, monkeypatch):
    _as_rank(monkeypatch, 0)
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("convoy.test").exception("failed")
    assert logged.records[-1].exc_info[0] is ValueError


def test_progress_bar_only_on_main_and_switch(monkeypatch):
    _as_rank(monkeypatch, 1)
    assert progress.progress_bar(range(3)).disable is True
    assert progress.progress_bar(range(3), main_process_only=False).disable is False
    _as_rank(monkeypatch, 0)
    assert progress.progress_bar(range(3)).disable is False
    assert progress.progress_bar(range(3), disable=True).disable is True
    progress.disable_progress_bars()
    try:
        assert not progress.progress_bars_enabled()
        assert progress.progress_bar(range(3)).disable is True
    finally:
        progress.enable_progress_bars()
    assert list(progress.progress_bar(range(3))) == [0, 1, 2]


LOG_SCRIPT = Path(__file__).parent / "scripts" / "log_levels.py"


def _logged(cwd: Path, *args: str, **env: str) -> str:
    """What ``log_levels.py`` prints in a plain process (no launcher) run from ``cwd``."""
    scrubbed = {k: v for k, v in cpu_env(env).items() if k not in ("RANK", "WORLD_SIZE")}
    done = processes.run([sys.executable, str(LOG_SCRIPT), *args], cwd=cwd, env=scrubbed, capture_output=True,
                         text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_a_program_without_logging_configured_sees_info_and_the_configured_level(tmp_path):
    """Python hands a record no handler takes to logging.lastResort, which prints warnings only: logger.info
    printed nothing, whatever CONVOY_LOG_LEVEL said. The level is the variable's, else convoy.toml's, else info;
    an application's own logging configuration is left alone, and takes over once made."""
    assert _logged(tmp_path).splitlines() == ["INFO shown", "EVERY RANK", "WARNING shown"]
    (tmp_path / "convoy.toml").write_text('log_level = "debug"\n')
    assert _logged(tmp_path).splitlines() == ["DEBUG shown", "INFO shown", "EVERY RANK", "WARNING shown"]
    assert _logged(tmp_path, CONVOY_LOG_LEVEL="warning").splitlines() == ["WARNING shown"]
    (tmp_path / "convoy.toml").unlink()
    assert _logged(tmp_path, "--configure-first").splitlines() == ["CONFIGURED WARNING shown"]  # root's level
    assert _logged(tmp_path, "--configure-after").splitlines() == [
        "INFO shown", "EVERY RANK", "WARNING shown", "CONFIGURED AFTER basicConfig"]


@pytest.mark.slow
def test_info_is_printed_under_convoy_launch(tmp_path):
    """docs/configuration.md's `logger.info(...)` under `convoy launch` with CONVOY_LOG_LEVEL=info: rank 0's
    message once, every rank's with its prefix, nothing below the level."""
    result = run_script(LOG_SCRIPT, nproc=2, env={"CONVOY_LOG_LEVEL": "info"}, cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert result.output.count("INFO shown") == 1 and result.output.count("WARNING shown") == 1, result.output
    assert "[rank0]: EVERY RANK" in result.output and "[rank1]: EVERY RANK" in result.output, result.output
    assert "[rank1]: [rank" not in result.output, result.output  # the rank said once, not twice
    assert "DEBUG shown" not in result.output, result.output
