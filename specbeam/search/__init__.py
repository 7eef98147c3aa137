"""The decoding algorithms: speculative generators and their parts (drafter, verifier,
acceptor, draft trees, tree attention, speculative KV caches), over the kernels below
(`specbeam.kernels`)."""
