"""mcpmux's own tools: the meta-tools and the local inference tools."""
