"""A consumed Kafka record without a broker, for the tests of what reads one."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class FakeMessage:
    """A record as a confluent_kafka Message shows it: no error, CreateTime 1000 + offset ms,
    one header, leader epoch 3."""

    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return [("h", b"1")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000 + self._offset)  # TIMESTAMP_CREATE_TIME

    def leader_epoch(self) -> int | None:
        return 3

    def error(self) -> None:
        return None


class FakeTransactional:
    """A transactional producer that keeps what it is given and commits at once (override a
    method to make it fail or hang); `commits` counts the transactions committed."""

    def __init__(self) -> None:
        self.commits = 0
        self.produced: list[tuple[str, bytes]] = []

    def begin_transaction(self) -> None:
        return None

    def produce(self, topic: str, key: bytes, value: bytes, **kwargs: object) -> None:
        self.produced.append((topic, value))

    def send_offsets_to_transaction(
        self, positions: object, metadata: object, timeout: float
    ) -> None:
        return None

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1

    def poll(self, timeout: float) -> int:
        return 0
