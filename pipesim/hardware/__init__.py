"""The machine: devices, nodes and the links between them (machine), read from and written
to TOML (toml_io)."""
