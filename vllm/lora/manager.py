"""The worker side of LoRA: slots per virtual engine and each step's token slots.

Each adapted linear layer of this stage gets a :class:`~vllm.lora.layers.LoRALinear` with
``max_loras`` slots per virtual engine (VE). Preparing a step (:meth:`LoRAManager.stage`)
puts every adapter the step uses into a slot of the step's VE (a slot whose adapter the
step does not use is reused, least recently used first; the scheduler admits at most
``max_loras`` adapters per VE, vllm/core/scheduler.py) and uploads each token's slot into
the VE's static buffer, which eager passes and replayed CUDA graphs read alike. The slot
writes and the upload are queued on the device in step order, after the VE's previous
step, so a step never sees another step's adapters. Adapters are read from disk once and
kept on the host for the ``max_cpu_loras`` most recently used, pinned ones always
(:meth:`LoRAManager.pin`, upstream's ``pin_lora``).

Under tensor parallelism each rank holds its layers' part of every adapter, cut as the
weights are (``LinearBase.lora_shard``: B's rows on column-parallel layers, A's columns on
row-parallel ones, whose terms the all-reduce then sums).

Slots are per VE because under pipeline parallelism the VEs' steps interleave on one
stage: one VE's adapters must not replace another's between its passes.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from vllm.lora.adapter import check_adapter, load_adapter
from vllm.lora.layers import LoRAContext, LoRALinear
from vllm.lora.request import LoRARequest
from vllm.model_executor.layers.linear import LinearBase
from vllm.utils import to_device


class LoRAManager:
    """Adapter slots of one stage's model (see the module doc).

    Args:
        model: this stage's model (``model.model.layers``, ``packed_modules_mapping``,
            ``lora_target_modules``, ``config``).
        lora_config: the engine's :class:`~vllm.lora.config.LoRAConfig`.
        num_ves: virtual engines.
        max_tokens: tokens of the largest forward pass (padded sizes included).
        dtype, device: the model's.
    """

    def __init__(self, model, lora_config, num_ves: int, max_tokens: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.config = lora_config
        self.hf_config = model.config
        self.supported = tuple(model.lora_target_modules)
        self.ctx = LoRAContext(num_ves, max_tokens, device)
        # PEFT name -> (the model's module name, shard id or None for the whole output)
        packed = {k: v for k, v in model.packed_modules_mapping.items() if k in self.supported}
        self.targets = {m: packed.get(m, (m, None)) for m in self.supported}
        own = {fused for fused, _ in self.targets.values()}
        # (layer, module name) -> the adapted linear layer (its slots: ``.lora``)
        self.modules: dict[tuple[int, str], LinearBase] = {}
        decoder = model.model
        for i in range(decoder.start_layer, decoder.end_layer):
            for name, module in decoder.layers[i].named_modules():
                short = name.rsplit(".", 1)[-1]
                if short not in own or not isinstance(module, LinearBase):
                    continue
                module.lora = LoRALinear(
                    module.output_slices(), module.input_size, module.output_size, num_ves,
                    lora_config.max_loras, lora_config.max_lora_rank, self.ctx, dtype, device,
                )  # fmt: skip
                self.modules[(i, short)] = module
        self.slot_ids: list[list[int | None]] = [
            [None] * lora_config.max_loras for _ in range(num_ves)
        ]
        self.last_used: list[list[int]] = [[0] * lora_config.max_loras for _ in range(num_ves)]
        self.clean = [True] * num_ves  # the VE's token slots are all -1
        self.tick = 0
        self.host: OrderedDict[int, dict] = OrderedDict()  # lora id -> tensors, LRU
        self.pinned: set[int] = set()  # never dropped from ``host``

    def add(self, req: LoRARequest) -> None:
        """Read ``req``'s adapter into the host cache now (upstream's ``add_lora``), not at
        the first step that uses it."""
        self._tensors(req)

    def remove(self, lora_id: int) -> None:
        """Forget adapter ``lora_id``: its host tensors, its pin and every slot holding it
        (a later request with the id reads its directory again)."""
        self.host.pop(lora_id, None)
        self.pinned.discard(lora_id)
        for ve, ids in enumerate(self.slot_ids):
            for slot, held in enumerate(ids):
                if held == lora_id:
                    for module in self.modules.values():
                        module.lora.clear(ve, slot)
                    ids[slot] = None

    def pin(self, req: LoRARequest) -> None:
        """Keep ``req``'s adapter in the host cache whatever ``max_cpu_loras`` says (read
        now if it is not there)."""
        self.pinned.add(req.lora_int_id)
        self._tensors(req)

    def stage(self, batch, metadata_list) -> None:
        """Put the adapters of ``batch``'s groups into slots of its VE and upload each
        token's slot (``batch`` a ForwardBatch whose rows are ``metadata_list``'s sequences
        in order).

        Raises:
            RuntimeError: more adapters in one step than ``max_loras`` (the scheduler
                prevents it).
        """
        ve = batch.virtual_engine
        wanted = {md.lora_request.lora_int_id: md.lora_request
                  for md in metadata_list if md.lora_request is not None}  # fmt: skip
        if not wanted:
            if not self.clean[ve]:
                self.ctx.token_slots[ve].fill_(-1)
                self.clean[ve] = True
            return
        slot_of = self._assign(ve, wanted)
        query_lens = batch.step.query_lens
        tokens: list[int] = []
        row = 0
        for md in metadata_list:
            slot = -1 if md.lora_request is None else slot_of[md.lora_request.lora_int_id]
            for _ in md.seq_data:
                tokens.extend([slot] * query_lens[row])
                row += 1
        n = batch.num_tokens
        tokens.extend([-1] * (n - len(tokens)))  # padded lanes and tokens
        host = torch.tensor(tokens, dtype=torch.int32)  # [num_tokens]
        # pinned and non-blocking: queued after the VE's previous step, no host wait
        self.ctx.token_slots[ve, :n].copy_(to_device(host, self.ctx.token_slots.device))
        if n < self.ctx.max_tokens:
            self.ctx.token_slots[ve, n:].fill_(-1)  # piecewise graphs read past n
        self.clean[ve] = False

    def _assign(self, ve: int, wanted: dict[int, LoRARequest]) -> dict[int, int]:
        """lora id -> slot of VE ``ve`` for every wanted adapter, loading the missing ones
        into free or least recently used slots that this step does not need."""
        ids = self.slot_ids[ve]
        if len(wanted) > len(ids):
            raise RuntimeError(
                f"a step of virtual engine {ve} uses {len(wanted)} LoRA adapters, above "
                f"max_loras={len(ids)}."
            )
        self.tick += 1
        slot_of = {}
        for lora_id in wanted:
            if lora_id in ids:
                slot_of[lora_id] = ids.index(lora_id)
        for lora_id, req in wanted.items():
            if lora_id in slot_of:
                continue
            free = [s for s in range(len(ids)) if ids[s] not in wanted]
            slot = min(free, key=lambda s: (ids[s] is not None, self.last_used[ve][s]))
            self._write(ve, slot, req)
            ids[slot] = lora_id
            slot_of[lora_id] = slot
        for slot in slot_of.values():
            self.last_used[ve][slot] = self.tick
        return slot_of

    def _write(self, ve: int, slot: int, req: LoRARequest) -> None:
        tensors = self._tensors(req)
        for module in self.modules.values():
            module.lora.clear(ve, slot)
        for (layer, peft_name), (a, b) in tensors.items():
            name, shard_id = self.targets[peft_name]
            module = self.modules.get((layer, name))
            if module is not None:  # None: a layer of another pipeline stage
                a_r, b_r = module.lora_shard(shard_id, a, b)  # this rank's
                module.lora.write(ve, slot, shard_id, a_r, b_r)

    def _tensors(self, req: LoRARequest) -> dict:
        """The adapter's tensors, from the host cache or read from disk."""
        got = self.host.get(req.lora_int_id)
        if got is None:
            spec = check_adapter(  # the engine checked the values before queueing
                req.lora_path,
                self.hf_config,
                self.supported,
                self.config.max_lora_rank,
                values=False,
            )
            got = load_adapter(spec)
            self.host[req.lora_int_id] = got
        self.host.move_to_end(req.lora_int_id)
        unpinned = [i for i in self.host if i not in self.pinned]  # least recent first
        for lora_id in unpinned[: max(0, len(self.host) - self.config.max_cpu_loras)]:
            if lora_id != req.lora_int_id:
                del self.host[lora_id]
        return got
