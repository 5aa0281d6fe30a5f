"""The ``densecnn`` subcommands, one module each."""
