"""`python -m mcpmux` is the `mcpmux` command."""

from mcpmux.cli.main import main

main()
