"""What clients talk to: the SDK front, the stdio and HTTP fronts, the HTTP edge."""
