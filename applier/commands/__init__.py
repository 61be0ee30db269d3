"""One module per ``applier`` subcommand; :mod:`applier.cli` parses the command line and calls them."""
