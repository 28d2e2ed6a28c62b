"""Math answer checking with math-verify, under a hard time limit.

``math_equal(gold, pred_text, timeout_s)`` is the one function the real benchmarks (GSM8K,
MATH-500, ``jsonl`` with ``verifier=math_verify``) call, for both the training reward and the
eval metric. They pass the answer their ``extract_answer`` found, as ``\\boxed{answer}``, so
math-verify compares that answer and never runs its own extraction over a whole completion (which
picks e.g. the 12 of "the answer:\\n12 - 5 = 6" where the benchmark records 6). It

1. parses the gold answer first, wrapped in ``\\boxed{...}`` unless it already holds a ``\\boxed``
   or ``$``, with ``LatexExtractionConfig()`` + ``ExprExtractionConfig()``;
2. parses the prediction with ``LatexExtractionConfig(boxed_match_priority=0)`` +
   ``ExprExtractionConfig()``; only a bounded piece of the completion is parsed: its boxed
   answer (``boxed_answer``: the last ``\\boxed{...}``, or last run of boxes) when there is one,
   otherwise the last ``MAX_PARSE_CHARS`` characters;
3. calls ``verify(gold, pred)`` in that order (math-verify is asymmetric: the gold guides the
   interpretation of the prediction);
4. when that says no, applies the percent rule (decision 1 below).

math-verify's own timeouts use ``signal.alarm``, which only works in the main thread, so they are
disabled (``parsing_timeout=None``, ``timeout_seconds=None``) and the whole check runs under our
own deadline instead:

* in the main thread (when no other ``ITIMER_REAL`` timer is armed): ``signal.setitimer`` with a
  handler raising a private ``BaseException``; this interrupts pure-Python sympy loops, regex
  backtracking and big-int arithmetic (measured: ``\\boxed{10^{10^{10}}}`` is stopped on time);
* anywhere else (worker threads, or a timer already armed): the check runs in a helper Python
  process (a plain subprocess talking over pipes, started once and reused; one per concurrent
  caller). The helper applies the same SIGALRM deadline in its own main thread, so a timeout
  normally leaves it warm; if it does not answer within ``timeout_s + 0.5`` s (C code ignoring the
  alarm) it is killed and a fresh one is started on the next call (about 2 s: importing sympy).

A timeout, or an exception escaping math-verify, gives ``None`` (unscorable); a prediction with
no parsable answer gives ``False``.

Grading decisions
-----------------
Made on real completions and labels nobody here made (issue 38, item 8); the numbers are kept by
tests/benchmarks/test_grader_agreement.py, the cases by tests/benchmarks/test_grading_decisions.py.

1. **A percent sign on a plain number does not make it wrong** (``_percent_equal``).
   ``\\boxed{20\\%}`` (also ``20%``, ``20 \\text{\\%}``, ``20 percent``) matches a gold ``20``, and
   ``\\boxed{20}`` a gold ``20\\%``, when the other side is a plain decimal number; math-verify
   reads ``20\\%`` as 0.2 and rejects both. Why: GSM8K golds are plain numbers, yet 75 GSM8K
   solutions (59 train, 16 test) end in "... = 20%." before "#### 20", so a model that learnt
   from them boxes ``20\\%``; Hendrycks' MATH ``is_equiv``, OpenAI's PRM800K grader
   (``grading/grader.py``), lm-eval's MATH tasks and Qwen2.5-Math's grader all drop ``\\%``
   from both sides before comparing. Only plain numbers are widened: against ``\\frac{1}{5}``
   or ``0.2``, ``\\boxed{20\\%}`` stays as math-verify decides, and ``21\\%`` is still wrong.
   Those 75 GSM8K answers: 0/75 accepted before, 75/75 now, the off-by-one ones 75/75 rejected.
2. **Several boxes: the last run of boxes is the answer** (``boxed_answer``). Boxes that only
   connectors separate (spacing, ``$``, ``\\quad``, commas, "and"/"or", a label such as
   ``x_2 =``) are one answer, joined with ", ", which math-verify reads as a set (as it does
   itself for ``\\boxed{a}, \\boxed{b}``); a box, then prose, then a box is an intermediate result
   and the answer, and only the last box counts, as in lm-eval's MATH tasks
   (``last_boxed_only_string``) and Qwen2.5-Math's grader (the text after the last "boxed").
   Why: real outputs with several boxes are multi-part answers (``\\boxed{(2, 2)} \\quad
   \\text{and}\\quad \\boxed{(6, 2)}`` for gold ``(2, 2), (6, 2)``), one answer restated (all 8
   MATH-500 gold solutions with two boxes; test/number_theory/459 writes
   ``\\boxed{15\\frac{39}{40}},$ or $\\boxed{\\frac{639}{40}}``, equal values, so the set is one
   value), or intermediate results boxed on the way. The last box alone agreed with 4 of
   Math-Verify's 16 graded several-box cases and rewarded a hedge (``\\boxed{2} or \\boxed{3}``
   against 3); the run agrees with 14/16, still accepts all 500 MATH-500 gold solutions, and
   rejects a hedge (the set {2, 3} is not 3).
3. **An unboxed MATH answer is read only after an explicit statement**
   (``boxed.stated_answer``). Without a box, the answer is what follows the last "final answer
   is" / "the answer is" / "Final Answer:": the ``$...$``, ``\\(...\\)`` or ``\\[...\\]`` right
   after it, or a single token with digits and no letters ("12,000,023.", "2/3"); prose after
   it, or no statement, is no answer (0.0); a later "# Answer" heading gives the line under it.
   Why: that is lm-eval minerva_math's format ("Final Answer: The final answer is $X$. I hope
   it is correct."), the phrases Qwen2.5-Math's grader reads when there is no box ("he answer
   is", "final answer is"), and PRM800K's (OpenAI's GPT-4 MATH solutions end in "# Answer",
   a blank line and the answer). Math-Verify's graded stated-answer cases: 1/12 before, 8/12
   now; the 500 MATH-500 gold solutions rewritten without a box and ending in the minerva line: 0/500 accepted before, 500/500 now, and all
   500 rejected when the line states the next problem's answer (the body still holds the right
   one: the statement is graded, not the text before it). No last-number or last-``$...$``
   fallback (Qwen's ``use_last_number``) when nothing is stated: it grades whatever quantity
   comes last. On 72 real completions of the shipped SmolLM2-135M-Instruct to MATH-500 test
   problems (``rredcot sample``, T=1.0, 256 tokens: the first 16 twice at seed 0, the first 40
   once at seed 1; 70 without a box, none right), a last-number fallback accepts one
   (test/number_theory/627, gold 3: a wrong derivation ending ``$n + 2n = n + 3$``) and a
   last-``$...$`` fallback another (test/number_theory/737, gold 284: it echoes the question's
   ``$284$`` and rambles); the stated-answer rule reads two answers ("So the answer is
   19.7098.", "So the final answer is $\\frac{85}{12.0 + 12.0} = 801.$"), both wrong, and
   accepts none. A truncated completion's trailing bare token or answer line may be cut short
   ("12" of "125"), so there only a closed math span or a finished line counts.

GSM8K keeps its own order (box, "####" / "final answer is", last number) and shares 1 and 2;
``jsonl`` with ``extractor=boxed`` shares 2, and with ``verifier=math_verify`` shares 1.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import signal
import sys
import threading
from typing import Any, Callable
from multiprocessing.connection import Connection
import subprocess

# Characters of a completion handed to the parser when it has no \boxed{...}.
MAX_PARSE_CHARS = 2000
# Seconds allowed for a helper process to start (python + import math-verify), not counted in the
# per-call deadline.
_WORKER_START_TIMEOUT_S = 120.0

_BOXED = "\\boxed"
_error_reported = False  # math_equal logs its first internal error only
_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
# What may stand between two boxes of one answer (``_boxed_run``): spacing, math delimiters,
# commas, "and"/"or" (bare or in \text{}), and a short label such as "x_2 =". Prose is not allowed:
# "\boxed{200} so the total is \boxed{455}" is a result and then the answer, not a two-part answer.
_RUN_GAP = re.compile(
    r"(?:\s|[,;&$]|\\[,;:! ]|\\q?quad(?![a-zA-Z])|\\\\|\\[\[\]()]|\b(?:and|or)\b"
    r"|\\(?:text|textrm|mathrm)\{\s*,?\s*(?:and|or)?\s*\}|[A-Za-z](?:_\{?\w{1,3}\}?)?\s?=)*"
)
_MAX_RUN_GAP = 80  # characters; keeps the gap check short on long completions
# A plain decimal number (thousands commas allowed), the only kind of gold or answer the percent
# rule touches.
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
# A percent sign (or word) ending an answer: "20\%", "20%", "20 \text{\%}", "20 percent".
_PERCENT_SUFFIX = re.compile(r"\s*(?:\\?%|\\text\{\s*\\?%\s*\}|\\(?:text|mbox)\{\s*percent\s*\}|percent)\s*$")


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------


def _closing_braces(text: str) -> dict[int, int]:
    """Index of every balanced ``{`` -> index of its ``}``; escaped braces (``\\{``, ``\\}``) do not
    count. One linear pass over ``text``."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character (\{, \}, \\ ...)
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    return closing


def _boxed_spans(text: str) -> list[tuple[int, int, int]]:
    """(start of ``\\boxed``, start of content, end of content) of every closed ``\\boxed{...}``, in
    the order they open; a ``\\boxed{`` never closed (a truncated completion) is left out."""
    opens = list(_BOXED_OPEN.finditer(text))
    if not opens:
        return []
    closing = _closing_braces(text)
    spans = []
    for match in opens:
        brace = match.end() - 1
        if brace in closing:
            spans.append((match.start(), brace + 1, closing[brace]))
    return spans


def _boxed_span(text: str) -> tuple[int, int, int] | None:
    """(start of ``\\boxed``, start of content, end of content) of the last balanced ``\\boxed{...}``.

    Escaped braces (``\\{``, ``\\}``) do not count. If the last ``\\boxed`` is not closed (a
    truncated completion), the one before it is used, and so on.
    """
    spans = _boxed_spans(text)
    return spans[-1] if spans else None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (balanced braces, nesting allowed), or None.

    >>> extract_boxed(r"so $x = \\boxed{\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    """
    span = _boxed_span(text)
    if span is None:
        return None
    return text[span[1] : span[2]].strip()


def _boxed_run(text: str) -> list[tuple[int, int, int]]:
    """The spans of the last run of boxes: the last ``\\boxed{}`` and the boxes right before it that
    only connectors separate from it (``\\boxed{2}, \\boxed{3}``, ``\\boxed{a} \\quad\\text{and}\\quad
    \\boxed{b}``, ``x_1 = \\boxed{a}\\) and \\(x_2 = \\boxed{b}``); boxes with prose between them are
    separate statements, and only the last one counts."""
    spans = _boxed_spans(text)
    if not spans:
        return []
    run = [spans[-1]]  # built from the last box backwards
    for span in reversed(spans[:-1]):
        gap_start, gap_end = span[2] + 1, run[-1][0]
        if gap_start > gap_end or gap_end - gap_start > _MAX_RUN_GAP:
            break  # a box around the run, or prose between
        if not _RUN_GAP.fullmatch(text, gap_start, gap_end):
            break
        run.append(span)
    return run[::-1]


def boxed_answer(text: str) -> str | None:
    """The boxed final answer of ``text``: the content of its last run of boxes (``_boxed_run``),
    joined with ``", "`` when there are several (math-verify reads the join as a set), or None.

    >>> boxed_answer(r"x = \\boxed{2} \\text{ or } x = \\boxed{3}.")
    '2, 3'
    >>> boxed_answer(r"first \\boxed{1}; then, after more work, \\boxed{4}.")
    '4'
    """
    run = _boxed_run(text)
    if not run:
        return None
    return ", ".join(text[start:end].strip() for _, start, end in run)


def _prediction_snippet(pred_text: str, max_chars: int) -> str | None:
    """The bounded part of a completion handed to the parser; None if the boxed answer is too long."""
    boxed = boxed_answer(pred_text)
    if boxed is not None:
        if len(boxed) > max_chars:
            return None
        return "\\boxed{" + boxed + "}"
    return pred_text[-max_chars:]


def _gold_snippet(gold: str) -> str:
    """The gold answer in a form the LaTeX extractor finds: ``\\boxed{gold}`` unless already marked up."""
    gold = gold.strip()
    if _BOXED in gold or "$" in gold.replace("\\$", ""):
        return gold
    return "\\boxed{" + gold + "}"


# --------------------------------------------------------------------------------------------
# The check itself (no time limit)
# --------------------------------------------------------------------------------------------


def _math_verify():
    """Import math-verify lazily and silence its one-off "timeout disabled" warning (we enforce our own)."""
    # deferred: math-verify and its ANTLR parser load in the verifier worker only
    import math_verify
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def _parse(mv, text: str, extraction_config: list) -> list:
    return mv.parse(text, extraction_config=extraction_config, parsing_timeout=None)


def _check(gold: str, pred_text: str, max_chars: int = MAX_PARSE_CHARS) -> bool | None:
    """math-verify's verdict for ``pred_text`` against ``gold``, without any time limit, widened by
    the percent rule (``_percent_equal``).

    None when the gold itself cannot be extracted (a broken benchmark row).
    """
    mv = _math_verify()
    gold_parsed = _parse(mv, _gold_snippet(gold), [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()])
    if not gold_parsed:
        return None
    snippet = _prediction_snippet(pred_text, max_chars)
    if snippet is None:
        return False
    pred_parsed = _parse(mv, snippet, [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()])
    if pred_parsed and mv.verify(gold_parsed, pred_parsed, timeout_seconds=None):
        return True
    answer = boxed_answer(pred_text)
    return answer is not None and _percent_equal(mv, gold, answer)


def _without_percent(text: str) -> str | None:
    """The plain number of ``text`` when it is one followed by a percent sign ("20\\%" -> "20"), else None."""
    text = text.strip().strip("$").strip()
    match = _PERCENT_SUFFIX.search(text)
    if match is None:
        return None
    number = text[: match.start()].strip()
    return number if _PLAIN_NUMBER.fullmatch(number) else None


def _percent_equal(mv, gold: str, answer: str) -> bool:
    """True when gold and answer are the same plain number and one of them carries a percent sign.

    math-verify reads ``\\boxed{20\\%}`` as 0.2 and so rejects it against a gold ``20`` (and ``\\boxed{20}``
    against a gold ``20\\%``). GSM8K golds are plain numbers even when the question asks "what
    percent"; Hendrycks' MATH ``is_equiv``, lm-eval's MATH tasks and Qwen2.5-Math's grader all drop
    ``\\%`` from both sides before comparing. Only plain numbers are touched, so ``0.2`` against
    ``20\\%`` stays as math-verify decides it.
    """
    gold = gold.strip().strip("$").strip()
    answer = answer.strip().strip("$").strip()
    if _PLAIN_NUMBER.fullmatch(gold):
        gold_number, answer_number = gold, _without_percent(answer)
    elif _PLAIN_NUMBER.fullmatch(answer):
        gold_number, answer_number = _without_percent(gold), answer
    else:
        return False
    if gold_number is None or answer_number is None:
        return False
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    gold_parsed = _parse(mv, "\\boxed{" + gold_number + "}", config)
    answer_parsed = _parse(mv, "\\boxed{" + answer_number + "}", config)
    return bool(gold_parsed and answer_parsed and mv.verify(gold_parsed, answer_parsed, timeout_seconds=None))


# --------------------------------------------------------------------------------------------
# Deadlines
# --------------------------------------------------------------------------------------------


class _Deadline(BaseException):
    """Raised by our SIGALRM handler; a BaseException so math-verify's ``except Exception`` lets it through."""


class _TimedOut:
    """Sentinel result of a call that ran past its deadline."""


TIMED_OUT = _TimedOut()


def _raise_deadline(signum, frame):  # noqa: ARG001 - signal handler signature
    raise _Deadline()


def _can_use_signal() -> bool:
    """True in the main thread of a POSIX process when no other real-time timer is armed."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def _call_with_signal(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """``fn(*args)`` interrupted by SIGALRM after ``timeout_s`` seconds (main thread only)."""
    previous = signal.signal(signal.SIGALRM, _raise_deadline)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        return TIMED_OUT
    finally:
        signal.signal(signal.SIGALRM, previous)


# Extra seconds a helper process gets beyond the deadline (it enforces the deadline itself with
# SIGALRM) before the caller kills it; only matters when C code ignores the alarm.
_WORKER_GRACE_S = 0.5

_WORKER_BOOT = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from rredcot_cli.benchmarks.verify import _serve; _serve(int(sys.argv[2]), int(sys.argv[3]))"
)


def _serve(read_fd: int, write_fd: int) -> None:
    """Main loop of a helper process: answer ``(fn, args, timeout_s)`` requests until EOF.

    Each request runs under SIGALRM (this is the helper's main thread), so an ordinary timeout
    leaves the helper alive and warm; replies are ``("ok", value)``, ``("timeout", None)`` or
    ``("error", message)``.
    """
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    _math_verify()  # warm up the import before announcing readiness
    replies.send("ready")
    while True:
        try:
            fn, args, timeout_s = requests.recv()
        except (EOFError, OSError):
            return
        try:
            value = _call_with_signal(fn, args, timeout_s)
            reply = ("timeout", None) if value is TIMED_OUT else ("ok", value)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            reply = ("error", f"{type(exc).__name__}: {exc}")
        replies.send(reply)


class HelperError(RuntimeError):
    """``fn`` raised in the helper process; the message is the original ``Type: message``."""


class _Worker:
    """A helper Python process running ``_serve``, talking over two pipes.

    A plain subprocess (not ``multiprocessing``) so that it never re-imports the caller's
    ``__main__`` and can be started from anywhere, daemonic processes included. It runs in its own
    session (Ctrl-C in a terminal does not reach it) and exits when its request pipe closes.
    """

    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT, json.dumps(sys.path), str(req_r), str(rep_w)],
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            for fd in (req_r, req_w, rep_r, rep_w):
                os.close(fd)
            raise
        os.close(req_r)
        os.close(rep_w)
        self.requests = Connection(req_w, readable=False)
        self.replies = Connection(rep_r, writable=False)
        if not self.replies.poll(_WORKER_START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("the math-verify helper process did not start")
        self.replies.recv()  # "ready"

    def call(self, fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
        """``fn(*args)`` in the helper; TIMED_OUT after ``timeout_s`` (killing the helper if it
        does not give up by itself within the grace period)."""
        self.requests.send((fn, args, timeout_s))
        if not self.replies.poll(timeout_s + _WORKER_GRACE_S):
            self.kill()
            return TIMED_OUT
        status, value = self.replies.recv()
        if status == "timeout":
            return TIMED_OUT
        if status == "error":
            raise HelperError(value)
        return value

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        for conn in (self.requests, self.replies):
            conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_pool_lock = threading.Lock()
_idle_workers: list[_Worker] = []
_all_workers: list[_Worker] = []
_atexit_registered = False


def _acquire_worker() -> _Worker:
    global _atexit_registered
    with _pool_lock:
        while _idle_workers:
            worker = _idle_workers.pop()
            if worker.alive():
                return worker
        if not _atexit_registered:
            atexit.register(shutdown_workers)
            _atexit_registered = True
    worker = _Worker()
    with _pool_lock:
        _all_workers.append(worker)
    return worker


def _release_worker(worker: _Worker) -> None:
    with _pool_lock:
        if worker.alive() and not worker.requests.closed:
            _idle_workers.append(worker)
        elif worker in _all_workers:
            _all_workers.remove(worker)


def shutdown_workers() -> None:
    """Stop every helper process (registered with ``atexit`` when the first one starts)."""
    with _pool_lock:
        workers = list(_all_workers)
        _all_workers.clear()
        _idle_workers.clear()
    for worker in workers:
        worker.kill()


def _call_in_worker(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """``fn(*args)`` in a pooled helper process (one per concurrent caller), TIMED_OUT after ``timeout_s``."""
    worker = _acquire_worker()
    try:
        return worker.call(fn, args, timeout_s)
    except HelperError:
        raise  # the exchange completed; the helper is fine
    except BaseException:
        worker.kill()  # a broken or interrupted exchange leaves the pipe out of step
        raise
    finally:
        _release_worker(worker)


def call_with_timeout(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """Run ``fn(*args)`` with a hard limit of ``timeout_s`` seconds; TIMED_OUT if it is exceeded.

    ``fn`` must be a module-level function (it may be sent to a helper process). Exceptions of
    ``fn`` propagate (from a helper process as HelperError with the original message).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if _can_use_signal():
        return _call_with_signal(fn, args, timeout_s)
    return _call_in_worker(fn, args, timeout_s)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def math_equal(gold: str, pred_text: str, timeout_s: float = 5.0, max_chars: int = MAX_PARSE_CHARS) -> bool | None:
    """Whether the final answer in ``pred_text`` equals ``gold`` according to math-verify.

    ``gold`` is a bare answer (``"70000"``, ``"\\frac{1}{2}"``, ``"(3,4]"``) or already marked-up
    text; ``pred_text`` is a whole completion. Only its boxed answer (``boxed_answer``) is parsed
    (one longer than ``max_chars`` counts as wrong), or, without one, its last ``max_chars``
    characters; a plain-number answer and gold that differ only by a percent sign are equal. Returns True/False, or None when the check ran past ``timeout_s`` seconds, raised
    an error, or the gold answer could not be extracted. Safe to call from any thread; returns
    within ``timeout_s`` (``timeout_s + 0.5`` s off the main thread).
    """
    global _error_reported
    try:
        result = call_with_timeout(_check, (gold, pred_text, max_chars), timeout_s)
    except Exception as exc:  # noqa: BLE001 - an internal verifier error makes the sample unscorable
        if not _error_reported:
            _error_reported = True
            logging.getLogger(__name__).warning(
                "math_equal: answer check failed, sample counted as unscorable (%s: %s); "
                "further failures are not logged", type(exc).__name__, exc,
            )
        return None
    if result is TIMED_OUT:
        return None
    return result
