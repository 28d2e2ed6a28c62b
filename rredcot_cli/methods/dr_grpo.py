"""Dr. GRPO advantage (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

A_i = r_i - mean(r_group) on every token: GRPO without the std division. The paper's other
change, dropping the 1/|y_i| length normalisation, lives in the loss: pair this method with
``train.loss_agg=constant`` (sum over tokens divided by the generation budget) as the
``dr_grpo`` experiment preset does.
"""

from __future__ import annotations

from dataclasses import dataclass

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage
from rredcot_cli.methods.grpo import grpo_advantage


@dataclass
class DrGRPOParams:
    pass


@register("dr_grpo", params=DrGRPOParams)
def dr_grpo(batch: CreditBatch) -> Credit:
    """Mean-centred outcome advantage broadcast to all tokens and segments; no state values."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std=False, eps=0.0)
    return broadcast_sequence_advantage(advantage, batch)
