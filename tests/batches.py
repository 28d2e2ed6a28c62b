"""Hand-made credit batches shared by the method tests."""

import torch

from rredcot_cli.methods.base import CreditBatch


def batch_from_segments(rewards, groups, seg_lengths, padding=0):
    """seg_lengths[i] = token counts of completion i's segments, then ``padding`` more columns
    of padding after the longest completion."""
    T = max(sum(s) for s in seg_lengths) + padding
    ids = torch.full((len(rewards), T), -1, dtype=torch.long)
    for i, lengths in enumerate(seg_lengths):
        t = 0
        for k, n in enumerate(lengths):
            ids[i, t : t + n] = k
            t += n
    return CreditBatch(rewards=torch.tensor(rewards, dtype=torch.float32), group_ids=torch.tensor(groups),
                       segment_ids=ids, num_segments=torch.tensor([len(s) for s in seg_lengths]))
