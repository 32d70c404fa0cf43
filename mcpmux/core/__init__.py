"""What every layer shares: configuration, names, the call plan, call tracking, logs, metrics."""
