"""convoy's settings: one schema, files in TOML, and a precedence with the source of every value.

    from convoy.config import effective_settings
    s = effective_settings()
    s.get("strategy"), s.source("strategy")       # ("ddp", "project file /repo/convoy.toml:2")

    $ convoy config --strategy ddp --mixed-precision bf16     # write the user file
    $ convoy config show                                      # effective values and their sources

Torch-free: the launcher, the Accelerator and the CLI all read settings through here.
"""

from convoy.config.files import project_config_path, read_settings_file, user_config_path, write_settings_file
from convoy.config.schema import KEYS, SCHEMA, Key, key_for
from convoy.config.settings import Settings, Source, effective_settings

__all__ = [
    "Key",
    "KEYS",
    "SCHEMA",
    "Settings",
    "Source",
    "effective_settings",
    "key_for",
    "project_config_path",
    "read_settings_file",
    "user_config_path",
    "write_settings_file",
]
