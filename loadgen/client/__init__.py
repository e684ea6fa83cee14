"""The client: the engine that sends each request at its instant and times every chunk, its wire, runs and shards."""
