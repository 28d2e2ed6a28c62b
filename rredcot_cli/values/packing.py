"""Score many probes that extend prefixes of a few traces, without re-encoding the prefixes.

Two interchangeable scorers (tests check both against scoring each prefix from scratch):

- ``cached_probe_logprobs`` (the default): encode each trace once, then run its probes against
  the trace's KV cache, masked so each probe sees only its own prefix.
- ``packed_probe_logprobs``: one row ``[trace] + [probe 1] + [probe 2] + ...`` with a block
  attention mask, the trace cut after its last probed prefix; rows of similar length share a
  forward. Cheapest for a few short probes per short trace, but the dense (row x row) mask makes
  attention quadratic in the row length.

Position ids of a probe continue from its prefix, so each probe sees exactly what it would see
if ``trace[:prefix_len] + probe`` were run alone: cost grows with trace length + total probe
length, not with trace length x boundaries.

Both scorers first merge probes that compute the same thing (``merge_probes``): traces of one
group often share their first steps token for token, so many probes have the same prefix and the
same tokens; each is run once, and a probe that some encoded trace continues with is read off that
trace's encoding pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from rredcot_cli.policy.logprobs import scored_positions_forward
from rredcot_cli.policy.kvcache import prefilled_cache


@dataclass(frozen=True)
class Probe:
    trace: int  # index into the list of traces
    prefix_len: int  # trace tokens the probe sees (prompt + completion up to a boundary); >= 1
    tokens: tuple[int, ...]  # probe tokens appended after the prefix
    scored_from: int = 0  # log-probs are returned for tokens[scored_from:]


def merge_probes(traces: list[list[int]], probes: list[Probe]) -> tuple[list[Probe], list[int]]:
    """The distinct probes, and for each probe the index of its distinct one.

    Two probes are the same when their prefixes are the same tokens (``trace[:prefix_len]``, of
    the same or another trace) and they score the same tokens from the same offset: the model gives
    them the same log-probs. A distinct probe is kept on a trace that itself continues with the
    probe's tokens after that prefix, when one of the traces that have probes does (the KV-cache
    scorer reads such a probe off the trace's encoding pass), else on its first trace."""
    for probe in probes:
        if not 1 <= probe.prefix_len <= len(traces[probe.trace]):
            raise ValueError(f"probe prefix_len {probe.prefix_len} outside trace of length {len(traces[probe.trace])}")
    if not probes:
        return [], []
    owners = sorted({p.trace for p in probes})
    lengths = sorted({p.prefix_len for p in probes})
    # Traces that share each probe prefix: classes keyed by (prefix length, rolling hash of the
    # prefix), a member admitted only when its tokens equal the first member's (no collisions).
    classes: dict[tuple, list[int]] = {}
    class_of: dict[tuple[int, int], tuple] = {}  # (trace, prefix length) -> its class key
    for t in owners:
        trace, h, at = traces[t], 0, 0
        for n in lengths:
            if n > len(trace):
                break
            for token in trace[at:n]:
                h = (h * 1_000_003 + token + 1) % (2**61 - 1)
            at = n
            key = (n, h)
            members = classes.setdefault(key, [])
            if members and traces[members[0]][:n] != trace[:n]:
                key = (n, h, t)  # a hash collision: a class of its own
                members = classes.setdefault(key, [])
            members.append(t)
            class_of[(t, n)] = key
    merged: list[Probe] = []
    where: list[int] = []
    seen: dict[tuple, int] = {}
    for probe in probes:
        prefix_class = class_of[(probe.trace, probe.prefix_len)]
        key = (prefix_class, probe.tokens, probe.scored_from)
        if key not in seen:
            start, end = probe.prefix_len, probe.prefix_len + len(probe.tokens)
            home = next((t for t in classes[prefix_class] if tuple(traces[t][start:end]) == probe.tokens), probe.trace)
            seen[key] = len(merged)
            merged.append(Probe(trace=home, prefix_len=probe.prefix_len, tokens=probe.tokens,
                                scored_from=probe.scored_from))
        where.append(seen[key])
    return merged, where


def _rows(traces: list[list[int]], probes: list[Probe], max_row_tokens: int) -> list[tuple[int, int, list[int]]]:
    """Group probe indices into rows: (trace index, trace tokens the row carries, probe indices),
    each row at most ``max_row_tokens`` long unless a single probe alone exceeds it.

    A row carries its trace only up to the longest prefix among its probes: no probe attends
    further, so the trace's tail (the last segment, often the longest of a truncated chain) would be
    positions run for nothing."""
    by_trace: dict[int, list[int]] = {}
    for index, probe in enumerate(probes):
        by_trace.setdefault(probe.trace, []).append(index)
    rows = []
    for trace, indices in by_trace.items():
        current: list[int] = []
        length = len(traces[trace])
        for index in indices:
            n = len(probes[index].tokens)
            if current and length + n > max_row_tokens:
                rows.append(_row(trace, current, probes))
                current, length = [], len(traces[trace])
            current.append(index)
            length += n
        rows.append(_row(trace, current, probes))
    return rows


def _row(trace: int, indices: list[int], probes: list[Probe]) -> tuple[int, int, list[int]]:
    return trace, max(probes[i].prefix_len for i in indices), indices


def _row_length(row: tuple[int, int, list[int]], probes: list[Probe]) -> int:
    _, carried, indices = row
    return carried + sum(len(probes[i].tokens) for i in indices)


def _forward_chunks(rows, probes, rows_per_forward: int, max_mask_elements: int, max_padding: float):
    """Groups of rows for one forward each, bounded in count, in the size of their (rows, N, N)
    attention mask, and in padding.

    A forward pads every row to its longest, so rows go longest first and a forward closes when the
    next row would make more than ``max_padding`` of its positions padding: a 1,100-token row no
    longer drags seven 200-token rows up to its length (at ~1k-token chains unsorted chunks ran
    2.3x the positions the probes need). Padding bought nothing back: on one CPU thread a forward's
    cost per position barely depends on how many rows share it."""
    chunk: list = []
    widest, real = 0, 0
    for row in sorted(rows, key=lambda row: -_row_length(row, probes)):
        n = _row_length(row, probes)
        if chunk:
            count = len(chunk) + 1
            too_padded = count * widest - (real + n) > max_padding * count * widest
            if count > rows_per_forward or count * widest * widest > max_mask_elements or too_padded:
                yield chunk
                chunk, real = [], 0
        if not chunk:
            widest = n
        chunk.append(row)
        real += n
    if chunk:
        yield chunk


@torch.no_grad()
def packed_probe_logprobs(
    model: torch.nn.Module,
    traces: list[list[int]],
    probes: list[Probe],
    *,
    device: str = "cpu",
    max_row_tokens: int = 2048,
    rows_per_forward: int = 8,
    max_mask_elements: int = 2**26,
    max_padding: float = 0.125,
    stats: dict | None = None,
) -> list[torch.Tensor]:
    """Log-probs (temperature 1) of ``probe.tokens[scored_from:]`` after ``trace[:prefix_len]``.

    traces: token ids of prompt + completion; returns one float32 tensor (len(tokens) -
    scored_from,) per probe, in the order of ``probes``. Rows run longest first, at most
    ``rows_per_forward`` per forward and at most ``max_padding`` of a forward's positions padding
    (``_forward_chunks``). ``stats["forward_tokens"]`` counts the positions run through the model
    (padding included).
    """
    probes, where = merge_probes(traces, probes)
    results: list[torch.Tensor | None] = [None] * len(probes)
    # A row re-encodes its trace, so rows are allowed to grow to a few trace lengths.
    longest = max((len(t) for t in traces), default=0)
    rows = _rows(traces, probes, max(max_row_tokens, 4 * longest))
    neg = torch.finfo(torch.float32).min
    for chunk in _forward_chunks(rows, probes, rows_per_forward, max_mask_elements, max_padding):
        N = max(_row_length(row, probes) for row in chunk)
        input_ids = torch.zeros(len(chunk), N, dtype=torch.long)
        positions = torch.zeros(len(chunk), N, dtype=torch.long)
        allowed = torch.zeros(len(chunk), N, N, dtype=torch.bool)
        # where each probe's first token sits in its row, and where its predictions come from
        layout: list[tuple[int, int, int]] = []  # (row, probe offset in row, probe index)
        for r, (trace, carried, indices) in enumerate(chunk):
            base = traces[trace][:carried]
            L = len(base)
            input_ids[r, :L] = torch.tensor(base)
            positions[r, :L] = torch.arange(L)
            allowed[r, :L, :L] = torch.tril(torch.ones(L, L, dtype=torch.bool))
            offset = L
            for index in indices:
                probe = probes[index]
                n = len(probe.tokens)
                if not 1 <= probe.prefix_len <= L:
                    raise ValueError(f"probe prefix_len {probe.prefix_len} outside trace of length {L}")
                input_ids[r, offset : offset + n] = torch.tensor(probe.tokens)
                positions[r, offset : offset + n] = torch.arange(probe.prefix_len, probe.prefix_len + n)
                allowed[r, offset : offset + n, : probe.prefix_len] = True
                allowed[r, offset : offset + n, offset : offset + n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
                layout.append((r, offset, index))
                offset += n
            # Padding attends to itself only, so no row of the mask is empty (avoids NaNs).
            pad = torch.arange(offset, N)
            allowed[r, pad, pad] = True
        mask = torch.where(allowed, 0.0, neg)[:, None].to(device)
        # The prediction of probe token j comes from the position before it: the prefix's last
        # trace token for j = 0, probe token j - 1 otherwise. Only the scored tokens are read.
        rows, cols, targets, spans = [], [], [], []
        for r, offset, index in layout:
            probe = probes[index]
            n = len(probe.tokens)
            sources = [probe.prefix_len - 1] + list(range(offset, offset + n - 1))
            spans.append((index, len(cols), n - probe.scored_from))
            rows.extend([r] * (n - probe.scored_from))
            cols.extend(sources[probe.scored_from :])
            targets.extend(probe.tokens[probe.scored_from :])
        _, scored = scored_positions_forward(
            model, torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(cols, dtype=torch.long, device=device),
            torch.tensor(targets, dtype=torch.long, device=device),
            input_ids=input_ids.to(device), attention_mask=mask, position_ids=positions.to(device), use_cache=False)
        scored = scored.cpu()
        if stats is not None:
            stats["forward_tokens"] = stats.get("forward_tokens", 0) + len(chunk) * N
        for index, at, n in spans:
            results[index] = scored[at : at + n]
    return [results[w] for w in where]  # type: ignore[misc]


@torch.no_grad()
def unpacked_probe_logprobs(model: torch.nn.Module, traces: list[list[int]], probes: list[Probe], device: str = "cpu") -> list[torch.Tensor]:
    """Reference implementation: run ``trace[:prefix_len] + probe`` from scratch for every probe.
    O(prefix x probes); used by tests to check the packed path."""
    out = []
    for probe in probes:
        ids = list(traces[probe.trace][: probe.prefix_len]) + list(probe.tokens)
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        n = len(probe.tokens)
        rows = torch.arange(probe.prefix_len - 1, probe.prefix_len - 1 + n)
        out.append(logprobs[rows, torch.tensor(probe.tokens)][probe.scored_from :].cpu())
    return out


def _encode_traces(model: torch.nn.Module, traces: list[list[int]], device: str, rows: list[int], cols: list[int]):
    """One causal pass over the right-padded traces.

    Returns per-layer (keys, values) of shape (B, heads, T, head_dim) on ``device`` and the
    float32 log-probs (N,) of trace ``rows[i]``'s own token ``cols[i] + 1`` (teacher forcing) on
    the CPU: only the positions that probes read off the encoding are scored.
    """
    T = max(len(t) for t in traces)
    input_ids = torch.zeros(len(traces), T, dtype=torch.long)
    attention = torch.zeros(len(traces), T, dtype=torch.long)
    for i, trace in enumerate(traces):
        input_ids[i, : len(trace)] = torch.tensor(trace)
        attention[i, : len(trace)] = 1
    rows_t, cols_t = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
    # Probes that overlap on the trace read the same positions: each is scored once.
    unique, inverse = torch.unique(rows_t * T + cols_t, return_inverse=True)
    at_rows, at_cols = unique // T, unique % T
    targets = input_ids[at_rows, at_cols + 1]
    out, logprobs = scored_positions_forward(
        model, at_rows.to(device), at_cols.to(device), targets.to(device), cache=DynamicCache(),
        input_ids=input_ids.to(device), attention_mask=attention.to(device), use_cache=True)
    cache = out.cache if "cache" in out else out.past_key_values
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    return layers, logprobs.cpu()[inverse]


@torch.no_grad()
def cached_probe_logprobs(
    model: torch.nn.Module,
    traces: list[list[int]],
    probes: list[Probe],
    *,
    device: str = "cpu",
    traces_per_forward: int | None = None,
    row_tokens: int | None = None,
    max_probe_tokens: int | None = None,
    stats: dict | None = None,
) -> list[torch.Tensor]:
    """Same result as :func:`packed_probe_logprobs`, computed with a shared KV cache.

    Traces are encoded once, ``traces_per_forward`` at a time, sorted by length. A probe that continues its own
    trace is read off that encoding pass. The other probes of a trace are laid side by side in
    rows of at most ``row_tokens`` positions that attend to the trace's cached keys and values
    (cache positions < ``prefix_len`` - 1, then the probe causally; never another probe). A
    probe's attention work is (prefix + row) instead of a packed row's (trace + all probes), so
    cost stays linear in trace length at a fixed number of probes per token.
    ``traces_per_forward``, ``row_tokens`` and ``max_probe_tokens`` default to 16, 64 and 1024 on
    CPU, where forwards whose activations stay in the core's cache were 15-25% faster for the
    embedded model (docs/studies/throughput.md), and to 32, 256 and 8192 elsewhere.
    ``stats["forward_tokens"]`` counts trace and probe positions run (padding included).
    """
    on_cpu = str(device).startswith("cpu")
    traces_per_forward = traces_per_forward or (16 if on_cpu else 32)
    row_tokens = row_tokens or (64 if on_cpu else 256)
    max_probe_tokens = max_probe_tokens or (1024 if on_cpu else 8192)
    probes, where = merge_probes(traces, probes)
    results: list[torch.Tensor | None] = [None] * len(probes)
    by_trace: dict[int, list[int]] = {}
    for index, probe in enumerate(probes):
        if not 1 <= probe.prefix_len <= len(traces[probe.trace]):
            raise ValueError(f"probe prefix_len {probe.prefix_len} outside trace of length {len(traces[probe.trace])}")
        if probe.tokens:
            by_trace.setdefault(probe.trace, []).append(index)
        else:
            results[index] = torch.zeros(0)
    trace_ids = sorted(by_trace, key=lambda t: (len(traces[t]), t))  # similar lengths share an encoding pass
    neg = torch.finfo(torch.float32).min
    for start in range(0, len(trace_ids), traces_per_forward):
        group = trace_ids[start : start + traces_per_forward]
        local = {t: r for r, t in enumerate(group)}
        pending_by_trace: dict[int, list[int]] = {}
        # A probe that continues its own trace is scored by the encoding pass: its positions.
        own_rows: list[int] = []
        own_cols: list[int] = []
        own_spans: list[tuple[int, int, int]] = []  # (probe index, first of its positions, count)
        for t in group:
            trace = traces[t]
            for index in by_trace[t]:
                probe = probes[index]
                first, end = probe.prefix_len + probe.scored_from, probe.prefix_len + len(probe.tokens)
                if tuple(trace[probe.prefix_len : end]) == probe.tokens:
                    own_spans.append((index, len(own_cols), end - first))
                    own_rows.extend([local[t]] * (end - first))
                    own_cols.extend(range(first - 1, end - 1))
                else:
                    pending_by_trace.setdefault(t, []).append(index)
        layers, own = _encode_traces(model, [traces[t] for t in group], device, own_rows, own_cols)
        if stats is not None:
            stats["forward_tokens"] = stats.get("forward_tokens", 0) + len(group) * layers[0][0].shape[2]
        for index, at, n in own_spans:
            results[index] = own[at : at + n]
        # Each trace's probes are packed into rows of at most ``row_tokens`` (a probe takes its
        # length + 1); rows run in batches of at most ``max_probe_tokens`` positions.
        rows: list[tuple[int, list[int]]] = []
        for t in group:
            current: list[int] = []
            used = 0
            # Probes with similar prefixes share a row, so a row's cache context stays short.
            for index in sorted(pending_by_trace.get(t, []), key=lambda i: probes[i].prefix_len):
                n = len(probes[index].tokens) + 1
                if current and used + n > row_tokens:
                    rows.append((t, current))
                    current, used = [], 0
                current.append(index)
                used += n
            if current:
                rows.append((t, current))
        # A batch's cache is cut at its longest prefix: batch rows of similar prefix length.
        rows.sort(key=lambda row: probes[row[1][-1]].prefix_len)
        batch: list[tuple[int, list[int]]] = []
        widest = 0
        for row in rows + [None]:
            if row is not None:
                n = sum(len(probes[i].tokens) + 1 for i in row[1])
                if not batch or (len(batch) + 1) * max(widest, n) <= max_probe_tokens:
                    batch.append(row)
                    widest = max(widest, n)
                    continue
            _run_probe_rows(model, layers, local, traces, probes, batch, widest, neg, device, results, stats)
            batch, widest = ([row], sum(len(probes[i].tokens) + 1 for i in row[1])) if row is not None else ([], 0)
    return [results[w] for w in where]  # type: ignore[misc]


def _run_probe_rows(model, layers, local, traces, probes, rows, width, neg, device, results, stats) -> None:
    """Run rows of probes against their trace's cached keys/values.

    A row holds probes of one trace side by side. Each probe's input starts with the last prefix
    token (cache positions < prefix_len - 1 are visible to it), so every scored token is predicted
    inside this forward and the trace's logits never need to be kept; probes in a row do not see
    each other. One cache row per probe row (not per probe) keeps the copy of the cache small: it
    is copied once, into storage with room for the row (``kvcache.prefilled_cache``)."""
    if not rows:
        return
    context = max(probes[i].prefix_len for _, indices in rows for i in indices) - 1
    R = len(rows)
    storage = []
    for k, v in layers:
        pair = []
        for states in (k, v):
            buffer = states.new_empty((R, states.shape[1], context + width, states.shape[3]))
            for r, (trace, _) in enumerate(rows):
                buffer[r, :, :context] = states[local[trace], :, :context]
            pair.append(buffer)
        storage.append(tuple(pair))
    cache = prefilled_cache(storage, context)
    input_ids = torch.zeros(R, width, dtype=torch.long)
    positions = torch.zeros(R, width, dtype=torch.long)
    allowed = torch.zeros(R, width, context + width, dtype=torch.bool)
    layout: list[tuple[int, int, int]] = []  # (row, offset of the probe's first input, probe index)
    for r, (t, indices) in enumerate(rows):
        offset = 0
        for index in indices:
            probe = probes[index]
            last, n = probe.prefix_len - 1, len(probe.tokens) + 1
            input_ids[r, offset : offset + n] = torch.tensor((traces[t][last],) + probe.tokens)
            positions[r, offset : offset + n] = torch.arange(last, last + n)
            allowed[r, offset : offset + n, :last] = True
            block = slice(context + offset, context + offset + n)
            allowed[r, offset : offset + n, block] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            layout.append((r, offset, index))
            offset += n
        # Padding attends to itself only, so no row of the mask is empty (avoids NaNs).
        pad = torch.arange(offset, width)
        allowed[r, pad, context + pad] = True
    mask = torch.where(allowed, 0.0, neg)[:, None].to(device)
    # Only the scored tokens are read: position offset + j predicts the probe's token j.
    score_rows, score_cols, spans = [], [], []
    for r, offset, index in layout:
        probe = probes[index]
        first, end = offset + probe.scored_from, offset + len(probe.tokens)
        spans.append((index, len(score_cols), end - first))
        score_rows.extend([r] * (end - first))
        score_cols.extend(range(first, end))
    score_rows_t, score_cols_t = torch.tensor(score_rows, dtype=torch.long), torch.tensor(score_cols, dtype=torch.long)
    targets = input_ids[score_rows_t, score_cols_t + 1]
    _, logprobs = scored_positions_forward(
        model, score_rows_t.to(device), score_cols_t.to(device), targets.to(device), cache=cache,
        input_ids=input_ids.to(device), position_ids=positions.to(device), attention_mask=mask, use_cache=False)
    logprobs = logprobs.cpu()
    if stats is not None:
        stats["forward_tokens"] = stats.get("forward_tokens", 0) + R * width
    for index, at, n in spans:
        results[index] = logprobs[at : at + n]


PROBE_SCORING = ("auto", "kv_cache", "packed")


def probe_scorer(probe_scoring: str, *, auto: str):
    """The probe scorer called ``probe_scoring`` (``kv_cache`` or ``packed``; ``auto`` means
    ``auto``, the estimator's measured choice: docs/studies/rredcot-value-cost.md)."""
    if probe_scoring not in PROBE_SCORING:
        raise ValueError(f"unknown probe_scoring {probe_scoring!r}; valid: {', '.join(PROBE_SCORING)}")
    name = auto if probe_scoring == "auto" else probe_scoring
    return cached_probe_logprobs if name == "kv_cache" else packed_probe_logprobs


def value_stats(batch) -> dict | None:
    """The batch's cost record (``batch.extras["value_stats"]``: forward tokens and the like), made
    on first use; None for a batch without extras."""
    return batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
