"""A stand-in for the part of AsyncLLMEngine that the OpenAI handlers read and call before
they generate: its limits and policies as attributes, its checks as no-ops. The handler
tests subclass it with the ``generate()`` their case replays, so a handler runs on a real
tokenizer without a model or an engine thread.
"""


class StubEngine:
    """Attributes the handlers read (a 512-token context, FCFS, no pooler, no default
    sampling fields) and checks that accept everything; ``tokenizer`` is the one given."""

    max_model_len = 512
    scheduling_policy = "fcfs"
    pooler_config = None
    default_sampling: dict = {}

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def verify_params(self, params):
        pass

    def check_schedulable(self, prompt_len, n, reads_cache=True, max_tokens=None):
        pass

    async def prepare_grammar(self, params):
        pass


class ReplayEngine(StubEngine):
    """A :class:`StubEngine` whose ``generate()`` records the params it was given (as
    ``params``) and replays ``pieces``: one RequestOutput per piece, the text growing by
    it, token ids ``0..k-1``, the last one finished with "length"."""

    pieces: list[str] = []

    async def generate(self, prompt, params, rid, lora_request=None, priority=0, **kw):
        from vllm.outputs import CompletionOutput, RequestOutput

        self.params = params
        for k in range(1, len(self.pieces) + 1):
            done = k == len(self.pieces)
            text = "".join(self.pieces[:k])
            out = CompletionOutput(0, text, list(range(k)), None, None, "length" if done else None)
            yield RequestOutput(
                rid, prompt.get("prompt"), prompt["prompt_token_ids"], None, [out], done
            )
