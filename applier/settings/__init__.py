"""Settings: the one schema for flags, ``APPLIER_*`` variables and the TOML file, and the
downstream connection settings every command derives from it."""
