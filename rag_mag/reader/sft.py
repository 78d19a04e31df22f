"""TRL's SFTTrainer with a loss that projects only the answer tokens through the LM head.

The loss is TRL's (mean token cross-entropy over the completion tokens); what changes is where it is computed.
SmolLM2's vocabulary has 49,152 entries, so the logits of a whole batch of 600-token prompts are most of the
step's memory and time, although only the ~10 answer tokens of each sequence carry loss. On 2 CPU cores,
TRL's fused LM head on a padded batch of 8 took 154 s and 15.6 GB for the first step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from trl import SFTTrainer


def answer_token_loss(model, inputs: dict[str, torch.Tensor], num_items: int | torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Cross-entropy of the tokens whose label is not -100, from the hidden states of the positions that
    predict them (next-token shift), projected through the LM head alone: their mean, or their sum divided by
    ``num_items`` (the answer tokens of the whole accumulated batch)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                        use_cache=False).last_hidden_state      # (batch, length, hidden)
    targets = inputs["labels"][:, 1:]                              # (batch, length - 1)
    predicting = targets != -100
    logits = base.lm_head(hidden[:, :-1][predicting])              # (answer tokens, vocabulary)
    if logits.shape[0] == 0:
        return hidden.sum() * 0.0  # a batch without answer tokens: a finite zero that keeps the graph
    if num_items is None:
        return F.cross_entropy(logits.float(), targets[predicting])
    return F.cross_entropy(logits.float(), targets[predicting], reduction="sum") / num_items


class AnswerOnlySFTTrainer(SFTTrainer):
    """One sequence per forward pass (``per_device_train_batch_size=1``, the batch by gradient accumulation): a
    padded batch makes CPU attention materialize every layer's (length x length) weights, 22.5 GB for 8 sequences
    of 1,000 tokens, where one unpadded sequence at a time takes 4.1 GB at the same speed."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = answer_token_loss(model, inputs, num_items_in_batch)
        # Normalized by the whole accumulated batch's answer tokens already: the Trainer must not divide again.
        self.loss_is_scaled_for_ga = num_items_in_batch is not None
        return (loss, None) if return_outputs else loss
