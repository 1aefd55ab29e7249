"""Speculative decoding: proposers (draft model, n-gram), a batch-expansion scorer, a
rejection sampler and the worker that ties them together (SpecDecodeWorker)."""
