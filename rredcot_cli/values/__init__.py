"""State-value estimators V(S_k) for prefixes of sampled traces, computed without generation.

``answer_probe`` and ``suffix_is`` share one primitive: teacher-forced log-probs of short
token sequences ("probes") appended after a prefix of a trace, packed after the full trace in a
single forward pass with a block attention mask (``packing.packed_probe_logprobs``), so the trace
is encoded once whatever the number of boundaries.
"""
