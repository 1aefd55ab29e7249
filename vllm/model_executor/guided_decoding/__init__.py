"""Structured outputs through xgrammar: the life of a constrained request.

1. ``add_request`` (engine process): :class:`~.compiler.GrammarCache` parses the request's
   :class:`~vllm.sampling_params.GuidedDecodingParams` into an xgrammar grammar at once
   (fast; an invalid schema, regex or grammar raises ValueError before anything is
   queued) and compiles it for the tokenizer on a thread pool, cached by (constraint,
   tokenizer). The server awaits that future before queuing; the offline engine holds the
   request back from the scheduler until its grammar is ready, so a long compile never
   stalls the other requests' steps.
2. Each step (engine process, :class:`~.manager.GuidedDecodingManager`): after the
   scheduler picks the batch, the constrained sequences' matchers travel in
   ``SequenceGroupMetadata.guided_bitmasks`` (:mod:`.step_masks`). Each fills its token
   bitmask (one bit per vocabulary id, packed in int32 words) when the sampler first
   reads it, while the device runs the forward pass; a step sent to another process (the
   last pipeline stage samples) carries the filled rows instead.
3. Sampler (worker, :mod:`~.bitmask`): the constrained rows' disallowed tokens get logit
   -inf on the device, after logit_bias and penalties, before logprobs and sampling; the
   forward pass (and any CUDA graph) is untouched.
4. Output processing (engine process): each matcher accepts its sequence's new tokens; a
   matcher that terminated (grammar complete, EOS accepted) finishes the sequence.

Reasoning: a request whose constraint carries reasoning tag ids (a server's
``--reasoning-parser``) is unconstrained until its end tag (see :mod:`.manager`).

Decoding modes: a step with a constrained row (or one still reasoning) runs one decode
pass even when ``num_scheduler_steps`` > 1 (the mask needs the host between tokens), and
such a step makes no speculative proposals (speculation is off for the whole step).
"""

from vllm.model_executor.guided_decoding.bitmask import apply_token_bitmask

__all__ = ["apply_token_bitmask"]
