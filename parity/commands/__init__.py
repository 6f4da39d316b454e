"""Entry points: the `parity` command and its subcommands (the top layer)."""
