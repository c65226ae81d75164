"""A dead replica's in-flight requests move to a live replica of its stage (mode 1).

vllm-omni 0.30's orchestrator fails every request bound to a replica that died
(`Orchestrator._handle_dead_replica`). Where the stage receives its input through
`CodeclogKafkaConnector`, the log still holds each request from its first chunk, so the
plugin (omni.plugin) makes the orchestrator submit each such request again, to a live replica,
with the request it first submitted; the receiver there asks from chunk 0 and the connector
serves it. docs/vllm-omni.md, "When a stage dies", has the rule, its costs and the upstream
patch this stands in for (deploy/upstream/).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from codeclog.omni import ledger
from codeclog.omni.settings import read_settings

LOGGER = logging.getLogger("codeclog.omni")
ORCHESTRATOR_MODULE = "vllm_omni.engine.orchestrator"
POOL_MODULE = "vllm_omni.engine.stage_pool"
SETTING = "redispatch"  # in the edge's extra: false keeps vllm-omni 0.30's behaviour
WRAPPED = "_codeclog_redispatch"  # set on a class once its methods are wrapped
CONNECTOR = "CodeclogKafkaConnector"
FACTORY_MODULE = "vllm_omni.distributed.omni_connectors.factory"
PATCHED = "_redispatch_requests"  # the upstream patch's method (deploy/upstream/)


@dataclasses.dataclass
class Moves:
    """What one stage pool keeps to move its requests: the request each was first submitted
    as, how many engine outputs of each reached the orchestrator, and how many of a moved
    request's first outputs to drop (the new replica makes them again, from chunk 0)."""

    extra: dict[str, Any]  # the edge's connector extra: where the ledger is
    submitted: dict[str, Any] = dataclasses.field(default_factory=dict)
    outputs: dict[str, int] = dataclasses.field(default_factory=dict)
    skip: dict[str, int] = dataclasses.field(default_factory=dict)
    moved: list[str] = dataclasses.field(default_factory=list)  # request ids, in order

    def forget(self, request_id: str) -> None:
        self.submitted.pop(request_id, None)
        self.outputs.pop(request_id, None)
        self.skip.pop(request_id, None)

    def admit(self, output: Any) -> bool:
        """Whether an engine output goes on (False: the moved request's new replica made it
        again); counts it. A failure always goes on: it is news, never a copy."""
        request_id = output.request_id
        if getattr(getattr(output, "finish_reason", None), "name", None) == "ERROR":
            self.skip.pop(request_id, None)
            return True
        if self.skip.get(request_id, 0) > 0:
            self.skip[request_id] -= 1
            return False
        self.outputs[request_id] = self.outputs.get(request_id, 0) + 1
        return True


def enabled(connector_config: Any) -> bool:
    """Whether a stage whose input connector is `connector_config` (its `name` and `extra`,
    as vllm-omni puts it on the stage's model config) has its requests moved."""
    name, extra = _connector(connector_config)
    if name != CONNECTOR:
        return False  # shared memory and the others: nothing can be served again
    value = extra.get(SETTING, True)
    return str(value).lower() not in ("0", "false", "no", "off")


def _connector(connector_config: Any) -> tuple[Any, dict[str, Any]]:
    if isinstance(connector_config, Mapping):
        name, extra = connector_config.get("name"), connector_config.get("extra")
    else:
        name = getattr(connector_config, "name", None)
        extra = getattr(connector_config, "extra", None)
    return name, dict(extra or {})


def moves_of(pool: Any) -> Moves | None:
    """The pool's moves, where its stage has them (None: 0.30's behaviour)."""
    found = pool.__dict__.get(WRAPPED)
    if found is None:
        model_config = getattr(getattr(pool, "stage_vllm_config", None), "model_config", None)
        connector_config = getattr(model_config, "stage_connector_config", None)
        on = enabled(connector_config)
        found = Moves(_connector(connector_config)[1]) if on else False
        pool.__dict__[WRAPPED] = found
    return found or None


def install() -> bool:
    """Wrap the orchestrator's dead-replica handler and the stage pool's submit, output and
    release paths, once; where vllm-omni carries the upstream patch, register the connector's
    redelivery hook with its factory instead. False where vllm-omni's engine does not import."""
    try:
        orchestrator = importlib.import_module(ORCHESTRATOR_MODULE).Orchestrator
        pool = importlib.import_module(POOL_MODULE).StagePool
    except Exception:  # vllm_omni without vllm: no orchestrator to change
        return False
    if hasattr(orchestrator, PATCHED):  # vllm-omni with the upstream patch: it moves them
        _register_hook()
        return True
    if not getattr(orchestrator, WRAPPED, False):
        orchestrator._handle_dead_replica = _moving(orchestrator._handle_dead_replica)
        orchestrator._process_llm_stage_outputs = _deduplicating(
            orchestrator._process_llm_stage_outputs
        )
        setattr(orchestrator, WRAPPED, True)
    if not getattr(pool, WRAPPED, False):
        pool.submit_initial = _remembering(pool.submit_initial)
        pool.release_binding = _forgetting(pool.release_binding)
        setattr(pool, WRAPPED, True)
    return True


def _register_hook() -> None:
    factory = importlib.import_module(FACTORY_MODULE).OmniConnectorFactory
    if factory.redelivery_for(CONNECTOR) is None:
        factory.register_redelivery(CONNECTOR, prepare_redelivery)


def _moving(original: Any) -> Any:
    @functools.wraps(original)
    async def _handle_dead_replica(self: Any, stage_id: int, replica_id: int, error: Any) -> None:
        pool = self.stage_pools[stage_id]
        moves = moves_of(pool)
        survivors = [r for r in pool.live_replica_ids() if r != replica_id]
        if moves is None or not any(pool.is_replica_available(r) for r in survivors):
            await original(self, stage_id, replica_id, error)
            return
        movable = _stranded(self, pool, stage_id, replica_id, moves)
        kept = {rid: (moves.submitted[rid], moves.outputs.get(rid, 0)) for rid in movable}
        pool.release_bindings(movable)  # the original then fails only what cannot move
        await original(self, stage_id, replica_id, error)
        await _log_moves(moves, stage_id, replica_id, movable)
        for rid, (request, made) in kept.items():
            await _move(self, pool, stage_id, rid, request, made, moves)

    return _handle_dead_replica


def _stranded(
    orchestrator: Any, pool: Any, stage_id: int, replica_id: int, moves: Moves
) -> list[str]:
    """The requests bound to the dead replica that can move: submitted to the stage, not
    finished, and first submitted through this pool (so their request is known)."""
    return [
        rid
        for rid, state in list(orchestrator.request_states.items())
        if stage_id in state.stage_submit_ts
        and pool.get_bound_replica_id(rid) == replica_id
        and rid in moves.submitted
    ]


def prepare_redelivery(
    extra: Mapping[str, Any], requests: list[str], stage_id: int, replica_id: int
) -> None:
    """Put the moves of `requests` (away from the dead `replica_id`) on the edge's ledger
    before any is submitted again (omni.ledger): where the dead replica had ended a request
    whose last output never reached the orchestrator, the replica it moves to hands it out
    again, from chunk 0. The hook the upstream patch calls (deploy/upstream/)."""
    config = {**extra, "stage_id": stage_id, "replica_id": replica_id}
    config["producer_id"] = f"orchestrator-{os.getpid()}"
    settings = read_settings(config)
    acknowledged = ledger.write_moves(settings, requests, settings.group_id)
    if acknowledged < len(requests):  # the log out of reach: those ended there are refused
        LOGGER.warning(
            "codeclog: %d of %d moves of stage-%s replica-%s on the ledger",
            acknowledged,
            len(requests),
            stage_id,
            replica_id,
        )


async def _log_moves(moves: Moves, stage_id: int, replica_id: int, requests: list[str]) -> None:
    if not requests:
        return
    write = functools.partial(prepare_redelivery, moves.extra, requests, stage_id, replica_id)
    try:
        await asyncio.get_running_loop().run_in_executor(None, write)
    except Exception as exc:
        LOGGER.warning("codeclog: moves of stage-%s not on the ledger: %s", stage_id, exc)


async def _move(
    orchestrator: Any, pool: Any, stage_id: int, rid: str, request: Any, made: int, moves: Moves
) -> None:
    """Submit one request again to a live replica; its first `made` outputs are dropped."""
    moves.submitted[rid], moves.outputs[rid], moves.skip[rid] = request, made, made

    async def dispatch() -> None:
        replica = await pool._pick_or_select(rid)
        await pool._llm_client(replica).add_request_async(request)
        LOGGER.warning(
            "codeclog: request %s moved to stage-%s replica-%s (%d outputs made before)",
            rid,
            stage_id,
            replica,
            made,
        )

    moved = await orchestrator._dispatch_or_fail_request(
        dispatch, req_id=rid, stage_id=stage_id, operation="codeclog re-dispatch"
    )
    if moved:
        moves.moved.append(rid)
    else:
        moves.forget(rid)


def _remembering(original: Any) -> Any:
    @functools.wraps(original)
    async def submit_initial(
        self: Any, request_id: str, req_state: Any, request: Any, *args: Any, **kwargs: Any
    ) -> int:
        replica: int = await original(self, request_id, req_state, request, *args, **kwargs)
        moves = moves_of(self)
        if moves is not None and self.stage_type != "diffusion":
            moves.submitted[request_id] = request
        return replica

    return submit_initial


def _deduplicating(original: Any) -> Any:
    """Before the orchestrator reads a poll's engine outputs (errors, finishes, the output
    processor): a moved request's outputs its new replica made again are dropped."""

    @functools.wraps(original)
    async def _process_llm_stage_outputs(
        self: Any, stage_id: int, replica_id: int, raw_outputs: Any, *args: Any
    ) -> Any:
        moves = moves_of(self.stage_pools[stage_id])
        if moves is not None and raw_outputs.outputs:
            raw_outputs.outputs = [o for o in raw_outputs.outputs if moves.admit(o)]
        return await original(self, stage_id, replica_id, raw_outputs, *args)

    return _process_llm_stage_outputs


def _forgetting(original: Any) -> Any:
    @functools.wraps(original)
    def release_binding(self: Any, request_id: str) -> None:
        original(self, request_id)
        moves = moves_of(self)
        if moves is not None:
            moves.forget(request_id)

    return release_binding
