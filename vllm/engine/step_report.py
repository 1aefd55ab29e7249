"""A step's outputs in two halves: what the next schedule needs, and the rest.

Applying a step's samples (append the tokens, check the stop conditions, free finished
requests) must happen before the next step is scheduled. Turning them into text and
:class:`~vllm.outputs.RequestOutput` snapshots need not, and at large batches it is most
of the engine's host work per step (an incremental detokenization per sequence, a copy
of every reported request's token ids). ``LLMEngine.apply_outputs`` does the first half
and returns a :class:`StepReport`; :meth:`StepReport.finish` does the second.

Synchronous stepping finishes the report at once. With async output processing
(``ModelConfig.use_async_output_proc``, upstream V0's name and default) ``LLMEngine.step``
keeps the report of step N, schedules step N+1 and hands ``finish`` to the worker as the
request's ``async_callback``: it runs while the device computes step N+1, and ``step()``
returns step N's outputs once step N+1 has run. So each ``step()`` call returns the
previous step's outputs (the first returns none), with the same content as synchronous
stepping. A request with stop strings is detokenized in the first half, since its text
decides where it stops, and so is a constrained one (its grammar can end it after the
tokens are appended); every other stop condition reads only token ids and lengths.

Texts nobody reads are not made: when the engine does not stream outputs (the offline
``LLM.generate`` loop reads only finished requests) a running sequence's text waits until
it finishes, and then comes from the one-shot decode every finished sequence gets.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.engine.output_processor import finish_text_of, make_request_output
from vllm.outputs import RequestOutput
from vllm.sequence import SequenceGroup


class StepReport:
    """The second half of one step's output processing (see the module doc).

    Args:
        reported: the groups to snapshot as RequestOutputs, in output order.
        text_pending: the groups whose texts :func:`finish_text_of` still has to make.
        tokenizer: the engine's tokenizer.
        stream: make the texts of running sequences too (the engine streams outputs).
        on_error: called with (group, exception) when making a group's text fails; the
            other groups are finished regardless, and the failed ones are listed in
            :attr:`failed` for the engine to free (outside the worker's call).
    """

    def __init__(
        self,
        reported: list[SequenceGroup],
        text_pending: list[SequenceGroup],
        tokenizer,
        stream: bool,
        on_error: Callable[[SequenceGroup, Exception], None],
    ):
        self.reported = reported
        self.text_pending = text_pending
        self.tokenizer = tokenizer
        self.stream = stream
        self.on_error = on_error
        self.failed: list[SequenceGroup] = []
        self._outputs: list[RequestOutput] | None = None

    def finish(self) -> list[RequestOutput]:
        """Make the pending texts and the RequestOutputs; later calls return the same list
        (the worker may have called it already, see the module doc)."""
        if self._outputs is None:
            for group in self.text_pending:
                if not self.stream and not group.is_finished():
                    continue  # its text is made when it finishes
                try:
                    finish_text_of(group, self.tokenizer)
                except Exception as e:  # fail this request only
                    self.failed.append(group)
                    self.on_error(group, e)
            self._outputs = [make_request_output(g) for g in self.reported]
        return self._outputs

    def drop(self, group: SequenceGroup) -> None:
        """Leave out ``group`` (its request was aborted after the step): no text, no
        output."""
        self.reported = [g for g in self.reported if g is not group]
        self.text_pending = [g for g in self.text_pending if g is not group]
        if self._outputs is not None:
            self._outputs = [o for o in self._outputs if o.request_id != group.request_id]
