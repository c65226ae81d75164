"""What an authorisation refusal means for this member, and that it ends the member (exit 2:
docs/security.md, "Refusals")."""

from __future__ import annotations

import dataclasses

from codeclog.errors import CodeclogError
from codeclog.kafka.access import refusal
from codeclog.kafka.calls import raise_if_denied
from codeclog.topics_config import TopicsConfig


@dataclasses.dataclass(frozen=True)
class Refusals:
    """The member's resources, for naming what a refusal stopped."""

    client_config: dict[str, str]
    topics: TopicsConfig
    group: str
    transactional_id: str

    @property
    def doing(self) -> dict[str, str]:
        """Refusal kind -> what this member was doing (`codeclog.kafka.access`)."""
        t = self.topics
        return {
            "topic": f"READ topic {t.chunks} or WRITE topics {t.audio}, {t.dlq}, {t.progress}",
            "group": f"READ group {self.group}",
            "transactional id": f"WRITE transactional id {self.transactional_id}",
        }

    def of(self, exc: BaseException) -> CodeclogError | None:
        """The refusal `exc` is, as the error to end with; None for any other error."""
        return refusal(exc, self.client_config, self.doing)

    def raise_if_refused(self, exc: BaseException) -> None:
        if (refused := self.of(exc)) is not None:
            raise refused from exc
        raise_if_denied(exc)  # e.g. an authentication failure: no ACL resource to name
