"""`python -m mcpmux` is the `mcpmux` command."""

from mcpmux.cli import main

main()
