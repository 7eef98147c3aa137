"""The decoding algorithms: speculative generators and their parts (drafter, verifier,
acceptor, draft trees, tree attention, speculative KV caches, lean decoders)."""
