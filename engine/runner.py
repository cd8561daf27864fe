"""The model runner: a scheduled batch -> flat tensors -> one forward -> the logits needed.

For every scheduled request it lays out the tokens it computes this step back to back:
`input_ids` and `positions` ([num_tokens]), `slot_mapping` (where each token's K/V goes),
and per request its context length and block table. A request that will sample after this
step needs logits at its last position; one verifying a draft of k tokens needs k + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv.allocator import BlockAllocator
from engine.model.attention import build_metadata
from engine.scheduler import ScheduledRequest


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [num_logit_rows, vocab] fp32
    rows: dict[str, tuple[int, int]]  # request id -> (first logit row, number of rows)


class ModelRunner:
    def __init__(self, model, pool, allocator: BlockAllocator, backend, device):
        self.model, self.pool, self.allocator = model, pool, allocator
        self.backend, self.device = backend, device

    def run(self, batch: list[ScheduledRequest]) -> ForwardResult:
        input_ids, positions, slots = [], [], []
        query_lens, seq_lens, tables = [], [], []
        logit_index: list[int] = []
        rows: dict[str, tuple[int, int]] = {}
        for s in batch:
            req = s.req
            if s.idle:
                # a finished static rider: recompute its last computed position, write nothing
                pos = req.num_computed_tokens - 1
                input_ids.append(req.all_token_ids[pos])
                positions.append(pos)
                slots.append(-1)
                query_lens.append(1)
                seq_lens.append(req.num_computed_tokens)
                tables.append(req.block_table)
                continue
            tokens = req.all_token_ids + req.spec_token_ids
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_tokens
            first_row = len(input_ids)
            input_ids.extend(tokens[start:end])
            positions.extend(range(start, end))
            slots.extend(self.allocator.slot(req, p) for p in range(start, end))
            query_lens.append(s.num_tokens)
            seq_lens.append(end)
            tables.append(req.block_table)
            if end >= req.num_tokens:  # caught up: logits for the last real token and the draft
                n_rows = end - (req.num_tokens - 1)
                rows[req.request_id] = (len(logit_index), n_rows)
                logit_index.extend(range(first_row + s.num_tokens - n_rows,
                                         first_row + s.num_tokens))
        meta = build_metadata(query_lens, seq_lens, tables, slots, self.allocator.block_size,
                              self.device)
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model.forward(ids, pos, meta, self.pool.layers, self.backend)
        if not logit_index:
            return ForwardResult(torch.empty(0, 0), rows)
        idx = torch.tensor(logit_index, dtype=torch.long, device=self.device)
        logits = self.model.logits(hidden[idx]).cpu()
        return ForwardResult(logits, rows)
