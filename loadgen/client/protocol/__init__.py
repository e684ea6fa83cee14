"""What a streamed answer's bytes mean: SSE framing, the token tally, and the ways a stream goes wrong (no I/O)."""
