"""The `mcpmux` command."""
