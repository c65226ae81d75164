"""`codeclog vocode`: the Code2Wav consumer (fold, batched vocoder decode, exactly-once audio)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from codeclog.cli.config import (
    add_kafka_args,
    add_limit_args,
    kafka_client_config,
    limit_options,
    port_problem,
    topics_config,
)
from codeclog.cli.parsing import Subparsers, add_command, add_flag, add_variant_args
from codeclog.consumers.stream.fold.state import Policy
from codeclog.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CodeclogError, exit_code

ENV_KEEP_PRODUCER = "CODECLOG_TEST_KEEP_PRODUCER_AFTER_TIMEOUT"  # test-only, see VocodeConfig
EPILOG = """\
Exit codes (README, "Exit codes"): 0 stopped cleanly (SIGTERM/SIGINT finish the current step
and commit it, or idle with --exit-when-idle); 1 infrastructure failure (no answer from the
cluster, fenced, no commit for --outage-timeout after a failure, a stop that could not finish
within --stop-timeout: the open transaction is aborted first); 2 usage or configuration (bad
option, bad --kafka-config, metrics port in use); 3 strict policy hit a rejection (the upstream
would have died).

Examples:
  codeclog vocode                                # tiny model on CPU, tolerant policy
  codeclog vocode --vocoder /models/token2wav --device cuda --metrics-port 9311
  codeclog vocode --group g1 --instance-id b     # a second member of the same group
  codeclog vocode --vocoder /models/token2wav-1.0.7 --hift causal   # scheme B vocoder
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "vocode",
        "run the Code2Wav consumer",
        "Consume codec chunks, fold them per request, decode batches of windows "
        "with the Token2wav vocoder and write audio chunks, dead letters and recovery "
        "checkpoints in one Kafka transaction per step (exactly once for read_committed "
        "readers).",
        EPILOG,
    )
    add_kafka_args(parser)
    parser.add_argument("--group", default="codeclog-vocoder", help="consumer group id")
    parser.add_argument(
        "--instance-id",
        default="0",
        help="stable member id; a restart with the same id fences its predecessor's "
        "transaction at once (default: 0)",
    )
    parser.add_argument(
        "--vocoder",
        default="tiny",
        help="'tiny' (the committed CPU fixture) or a Token2wav checkpoint dir "
        "(flow.pt, hift.pt, flow.yaml)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1)")
    parser.add_argument(
        "--kernels",
        choices=("native", "portable"),
        default="native",
        help="native (default: torch's kernels, fastest; the audio bytes depend on the CPU "
        "vendor and ISA or the GPU) or portable (CPU only: the same bytes on every x86-64 CPU, "
        "so live audio equals any offline replay and a moved partition continues bytewise; "
        "about 5x the native decode time on the tiny model)",
    )
    parser.add_argument(
        "--batching",
        choices=("exact", "ragged"),
        default="exact",
        help="exact (default: windows of equal shape share a call, every row gets exactly "
        "the bytes of its solo decode) or ragged (all windows of a step in one flow and one "
        "HiFT call per final flag, padded and masked: fewer calls on a GPU, rows within a "
        "measured bound of solo decoding, see docs/vocoder.md)",
    )
    add_variant_args(
        parser,
        hift_help="the HiFT vocoder of this member's engine: noncausal (default: scheme A, 8 "
        "frames cross-faded between windows) or causal (scheme B, minicpmo-utils 1.0.7: a "
        "fixed 8-frame delay and a bounded history, no cross-fade; needs the 1.0.7 checkpoint "
        "layout, exact batching only). A different variant is a different determinism domain; "
        "a member refuses streams a member of the other variant checkpointed",
        dtype_help="the flow's precision (HiFT stays float32): float32 (default), bfloat16, or "
        "float16 (CUDA only). Not float32: another determinism domain (other audio bytes)",
    )
    parser.add_argument(
        "--decode-workers",
        type=int,
        default=None,
        metavar="N",
        help="threads a CPU decode batch is split across (default: one per core, up to 4; "
        "the audio is byte-identical for any N)",
    )
    parser.add_argument(
        "--policy",
        choices=[p.value for p in Policy],
        default=Policy.TOLERANT.value,
        help="tolerant (default: a bad chunk costs at most its request) or strict (the "
        "upstream's rules: the first rejection stops the stage)",
    )
    parser.add_argument("--max-records", type=int, default=64, help="records per step")
    add_limit_args(parser)
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus port")
    parser.add_argument(
        "--exit-when-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds without input (tests, demos)",
    )
    parser.add_argument(
        "--outage-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="after a failed transaction or Kafka call the member aborts, rebuilds and "
        "retries; if nothing commits within this long it exits 1 (default 60)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=25.0,
        metavar="SECONDS",
        help="SIGTERM/SIGINT end the process within this long: the current step commits "
        "(exit 0), or, if it cannot finish in time, exit 1 without it (default 25)",
    )
    add_flag(
        parser,
        "--no-live-audio",
        help="write no live copy of each window (docs/listening.md): half the audio bytes; "
        "speculative listeners then hear each window once its transaction committed",
    )
    add_flag(parser, "-v", "--verbose", help="log every step and librdkafka's own lines")
    parser.set_defaults(func=run)


def _refused(args: argparse.Namespace) -> str | None:
    """Why these options cannot work (one sentence), or None. librdkafka aborts the whole
    interpreter on some values (an empty group.id), so they are checked before any client."""
    if not args.group.strip():
        return "--group must not be empty"
    if not args.instance_id.strip():
        return "--instance-id must not be empty"
    if args.max_records < 1:
        return "--max-records must be >= 1"
    if args.hift == "causal" and args.batching == "ragged":
        return "--hift causal batches exact only (ragged batching is scheme A's): drop --batching"
    if args.dtype == "float16" and not args.device.startswith("cuda"):
        return "--dtype float16: half precision is for CUDA; on the CPU use float32 or bfloat16"
    if args.decode_workers is not None and args.decode_workers < 1:
        return "--decode-workers must be >= 1"
    if problem := port_problem("--metrics-port", args.metrics_port):
        return problem
    if not args.outage_timeout > 0 or not args.stop_timeout > 0:
        return "--outage-timeout and --stop-timeout must be > 0"
    return None


def run(args: argparse.Namespace) -> int:
    from codeclog.cli.stop_signals import install_stop_handlers
    from codeclog.malloc_arenas import cap_arenas

    cap_arenas()  # first, while this is the only thread (docs/operating.md, "Memory and bounds")
    stop = threading.Event()
    install_stop_handlers(stop)  # before the (slow) model load: SIGTERM then exits cleanly
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # librdkafka's own lines (every failed reconnect, ...) are for -v; ours say what matters.
    logging.getLogger("codeclog.kafka").setLevel(
        logging.DEBUG if args.verbose else logging.CRITICAL
    )
    problem = _refused(args)
    if problem:
        print(f"codeclog vocode: {problem}", file=sys.stderr)
        return EXIT_USAGE
    client_config = kafka_client_config(args)  # a CodeclogError: one line (codeclog.cli)
    topics = topics_config(args)
    limits = limit_options(args)
    from codeclog.consumers.member.metrics import VocoderMetrics
    from codeclog.consumers.member.service import VocodeConfig, VocoderService
    from codeclog.consumers.stream.engine import check_engine_fits
    from codeclog.consumers.stream.fold.state import FoldConfig
    from codeclog.vocoder.engine import Code2WavEngine

    try:  # before the (slow) model load: a port in use is reported at once
        metrics = VocoderMetrics.create(args.metrics_port)
    except OSError as exc:
        print(
            f"codeclog vocode: cannot serve metrics on port {args.metrics_port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return EXIT_USAGE

    try:
        engine = Code2WavEngine.from_spec(
            args.vocoder,
            device=args.device,
            workers=args.decode_workers,
            kernels=args.kernels,
            batching=args.batching,
            hift=args.hift,
            dtype=args.dtype,
        )
        check_engine_fits(FoldConfig(policy=Policy(args.policy)), engine)
    except Exception as exc:  # any load failure is reported in one sentence
        print(f"codeclog vocode: cannot load vocoder {args.vocoder!r}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = VocodeConfig(
        group=args.group,
        instance_id=args.instance_id,
        policy=Policy(args.policy),
        max_records=args.max_records,
        max_batch=args.max_records,
        limits=limits,
        exit_when_idle_s=args.exit_when_idle,
        outage_timeout_s=args.outage_timeout,
        live_audio=not args.no_live_audio,
        # test-only: the network-fault test shows what happens without the defence
        reinit_after_indefinite=not os.environ.get(ENV_KEEP_PRODUCER),
    )
    service = VocoderService(
        client_config,
        topics,
        config,
        engine,
        metrics,
        stop_event=stop,
    )
    _watch_stop(stop, service.finished, args.stop_timeout, service.bootstrap)
    code = _run(service)
    # A SIGTERM that arrives while the interpreter shuts down (handlers already reset) must not
    # turn a clean stop into "killed by signal": we are stopping anyway.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stats = service.stats
    if code == 0 or stats["steps"]:  # a failure to start is its one line, nothing more
        print(
            f"vocode: {stats['records']} records, {stats['windows']} audio windows, "
            f"{stats['dead_letters']} dead letters in {stats['steps']} transactions",
            file=sys.stderr,
        )
    # Everything of ours is committed or aborted and the clients are closed. Leave without the
    # interpreter's teardown: a producer given up on may still have a call inside librdkafka
    # (destroying it can block forever), and native worker threads (torch's pools, librdkafka)
    # destroyed during teardown have ended the process with SIGABRT ("terminate called without
    # an active exception") after a clean stop.
    del service
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(service: Any) -> int:
    """The member's run as an exit code, its end as one line (README, "Exit codes")."""
    from codeclog.kafka.calls import one_line

    try:
        service.run()
        return EXIT_OK
    except CodeclogError as exc:
        print(f"codeclog vocode: {one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    except Exception as exc:  # a bug: still one line (the traceback is logged with -v)
        logging.getLogger("codeclog.vocode").debug("unexpected error", exc_info=True)
        print(f"codeclog vocode: unexpected {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _watch_stop(
    stop: threading.Event, finished: threading.Event, timeout_s: float, bootstrap: str
) -> None:
    """SIGTERM ends the process within `timeout_s`, whatever is stuck: if the member has not
    finished its clean stop by then, one line and exit 1 (the next member redoes the step)."""

    def watch() -> None:
        while not stop.wait(0.5):
            if finished.is_set():
                return
        if finished.wait(timeout_s):
            return
        print(
            f"codeclog vocode: asked to stop, but the current step did not finish within "
            f"{timeout_s:g} s (cluster at {bootstrap}); exiting without committing it (the "
            "next member redoes it)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_FAILURE)

    threading.Thread(target=watch, name="codeclog-stop", daemon=True).start()
