"""State-only replay of a capture table: the pipeline's decisions without the pipeline.
Reasons: docs/replay.md, "State-only replay"."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from codeclog.consumers.stream.fold.outcomes import Reject, RejectReason
from codeclog.consumers.stream.fold.report import ReportBuilder
from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state
from codeclog.consumers.stream.wire_input import KEY_MISMATCH, MISSING_KEY
from codeclog.cores import one_per_core
from codeclog.replay.columns import CaptureTable
from codeclog.schemas.columnar import decode_spans
from codeclog.schemas.records import CodecChunk, ControlEvent

UNDECODABLE = RejectReason.UNDECODABLE_RECORD.value
MAX_WORKERS = 4  # processes a tolerant replay uses by default (capped by the cores)
# below this a second process costs more than it saves (the fork, the report pickled back)
MIN_RECORDS_PER_WORKER = 10_000
Progress = Callable[[int], None]  # called with the records done so far
Part = tuple[dict[str, Any], Counter[str]]  # a report and its dead-letter reasons


def default_workers() -> int:
    return one_per_core(MAX_WORKERS)


def replay_table(
    table: CaptureTable,
    config: FoldConfig,
    step_records: int,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Part:
    """The pipeline's report and the dead-letter reasons of replaying `table` without audio.

    Tolerant folding keeps one state per partition, and the table is in partition order, so
    runs of whole partitions can be replayed by separate processes (fork) and their reports
    joined: the same bytes as one process, as long as no request id appears in two runs (a
    request lives in one partition unless its records were keyed inconsistently). When one
    does, the parts are thrown away and the table is replayed by one process."""
    count = default_workers() if workers is None else workers
    ranges = _partition_ranges(table.partitions.tolist(), count)
    if config.policy is not Policy.TOLERANT or len(ranges) < 2 or not _can_fork():
        return _replay_range(table, config, step_records, progress, 0, len(table))
    with collector_paused():
        parts = _replay_parallel(table, config, step_records, progress, ranges)
    joined = _join(parts) if parts is not None else None
    if joined is None:
        return _replay_range(table, config, step_records, progress, 0, len(table))
    if progress is not None:
        progress(len(table))
    return joined


def _replay_range(
    table: CaptureTable,
    config: FoldConfig,
    step_records: int,
    progress: Progress | None,
    lo: int,
    hi: int,
) -> Part:
    """Replay rows [lo, hi) of the table in this process: the values decoded in bulk, then
    every event folded by the fold itself. The decoded events are freed before the collector
    resumes (it would otherwise scan them all once more)."""
    with collector_paused():
        return _fold_rows(table, _decoded(table, lo, hi), lo, config, step_records, progress)


def _decoded(table: CaptureTable, lo: int, hi: int) -> list[Any]:
    """The values of rows [lo, hi), each a record or the DecodeError `wire.decode` raises."""
    starts, ends, present = table.value_spans()
    return decode_spans(table.data, table.buffer, starts[lo:hi], ends[lo:hi], present[lo:hi])


def _partition_ranges(partitions: Sequence[int], workers: int) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of whole partitions, about equal in records, at most `workers` of
    them, each at least MIN_RECORDS_PER_WORKER records (else one range)."""
    total = len(partitions)
    count = min(workers, total // MIN_RECORDS_PER_WORKER)
    if count < 2:
        return [(0, total)]
    bounds = [i for i in range(1, total) if partitions[i] != partitions[i - 1]]
    cuts, lo = [], 0
    for part in range(1, count):
        target = total * part // count
        cut = min((b for b in bounds if b > lo), key=lambda b: abs(b - target), default=None)
        if cut is None or cut in cuts:
            break
        cuts.append(cut)
        lo = cut
    edges = [0, *cuts, total]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _replay_parallel(
    table: CaptureTable,
    config: FoldConfig,
    step_records: int,
    progress: Progress | None,
    ranges: list[tuple[int, int]],
) -> list[Part] | None:
    """The first range here, the others in forked children (they inherit the table, nothing
    is copied in); None when a child failed (the caller then replays in one process)."""
    context = multiprocessing.get_context("fork")
    children = []
    for lo, hi in ranges[1:]:
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(
            target=_child, args=(sender, table, config, step_records, lo, hi), daemon=True
        )
        child.start()
        sender.close()
        children.append((child, receiver))
    scale = len(ranges)  # the progress of the first range stands for all of them
    lo, hi = ranges[0]
    parts = [
        _replay_range(
            table,
            config,
            step_records,
            (lambda done: progress(min(done * scale, len(table)))) if progress else None,
            lo,
            hi,
        )
    ]
    failed = False
    for child, receiver in children:
        try:
            parts.append(receiver.recv())
        except (EOFError, OSError):
            failed = True  # the child died before sending
        child.join()
        failed = failed or child.exitcode != 0
    return None if failed else parts


def _child(
    sender: Connection,
    table: CaptureTable,
    config: FoldConfig,
    step_records: int,
    lo: int,
    hi: int,
) -> None:
    # os._exit: a forked child must not run the parent's atexit hooks or flush its streams
    # (another thread may have held their locks at the fork).
    code = 1
    try:
        with sender:
            sender.send(_replay_range(table, config, step_records, None, lo, hi))
        code = 0
    finally:
        os._exit(code)


def _join(parts: Sequence[Part]) -> Part | None:
    """One report from the reports of disjoint partition runs, or None if a request id is in
    more than one (its outcomes and status would then depend on how the runs interleave)."""
    report, dead = parts[0][0], Counter(parts[0][1])
    requests = dict(report["requests"])
    events = report["events"]
    for other, other_dead in parts[1:]:
        if requests.keys() & other["requests"].keys():
            return None
        requests.update(other["requests"])
        events += other["events"]
        dead.update(other_dead)
    return {**report, "events": events, "requests": requests}, dead


@contextmanager
def collector_paused() -> Iterator[None]:
    """The replay allocates hundreds of thousands of objects that all live to its end: the
    cyclic collector would rescan them again and again (a third of the fold's time) and free
    nothing. Reference counting still frees garbage; the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fold_rows(
    table: CaptureTable,
    events: Sequence[Any],
    lo: int,
    config: FoldConfig,
    step_records: int,
    progress: Progress | None,
) -> Part:
    """What `AudioPipeline.step` does without a vocoder with `events`, the decoded values of
    table rows lo, lo + 1, ...: dead-letter what is not an event or not under its key, fold the
    rest into its partition's state (one state for all under strict) and report it."""
    builder = ReportBuilder(config.policy)
    keys = table.keys(slice(lo, lo + len(events)))
    dead: Counter[str] = Counter()
    state = new_state(config)
    for first, end in _state_runs(table, config, lo, lo + len(events)):
        if config.policy is Policy.TOLERANT:
            state = new_state(config)  # the table is in partition order: one run each
        for start in range(first, end, step_records):
            stop = min(start + step_records, end)
            for event, key in zip(events[start:stop], keys[start:stop], strict=True):
                if type(event) is not CodecChunk and type(event) is not ControlEvent:
                    dead[UNDECODABLE] += 1
                elif key is None and event.request_id:
                    dead[MISSING_KEY] += 1
                elif key is not None and key != event.request_id.encode():
                    dead[KEY_MISMATCH] += 1
                else:
                    _, outcomes = fold(state, event)
                    builder.add(event, outcomes)
                    for outcome in outcomes:
                        if type(outcome) is Reject:
                            dead[outcome.reason.value] += 1
            if progress is not None:
                progress(stop)
    return builder.result(), dead


def _state_runs(table: CaptureTable, config: FoldConfig, lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs [first, end) of rows lo..hi-1 (counted from lo) folded into one state: each
    partition's under tolerant, all of them under strict."""
    if config.policy is not Policy.TOLERANT:
        return [(0, hi - lo)]
    cuts = (np.flatnonzero(np.diff(table.partitions[lo:hi])) + 1).tolist()
    return list(itertools.pairwise([0, *cuts, hi - lo]))
