"""librdkafka's own mock cluster (rdkafka_mock.h), reached through ctypes: a broker that answers
a chosen request with a chosen error, which a real broker does only in a race.

The mock speaks the Kafka protocol on 127.0.0.1 inside this process, from the very librdkafka
that confluent_kafka loaded; confluent_kafka does not expose its fault injection
(`rd_kafka_mock_push_request_errors`), so this binds the C functions. Linux only: the library
is found in /proc/self/maps. Used where a test needs one broker answer that a real broker gives
only in a race, e.g. the NOT_COORDINATOR of a group coordinator still loading (tests/lag).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

API_OFFSET_FETCH = 9  # Kafka ApiKey of OffsetFetch (ListConsumerGroupOffsets, committed())
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
RD_KAFKA_PRODUCER = 0


def librdkafka_path() -> str:
    """The librdkafka that confluent_kafka loaded into this process."""
    import confluent_kafka.cimpl  # noqa: F401  (loads librdkafka)

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "librdkafka" in Path(path).name:
            return path
    raise RuntimeError("librdkafka is not loaded in this process")


class MockCluster:
    """A mock cluster of `brokers` brokers, hosted by a bare librdkafka handle of its own."""

    def __init__(self, brokers: int = 1) -> None:
        lib = ctypes.CDLL(librdkafka_path())
        lib.rd_kafka_conf_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.rd_kafka_conf_set.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
        lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_topic_create.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.rd_kafka_mock_push_request_errors_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int16,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_int),
        ]
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # the hosting handle has no bootstrap.servers on purpose: not worth a notice on stderr
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, 512)
        self._rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, 512)
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode()}")
        self._cluster = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, name: str, partitions: int) -> None:
        if self._lib.rd_kafka_mock_topic_create(self._cluster, name.encode(), partitions, 1):
            raise RuntimeError(f"cannot create mock topic {name}")

    def push_request_errors(self, api_key: int, *codes: int) -> None:
        """The next len(codes) requests of `api_key`, to any broker, fail with these codes."""
        errors = (ctypes.c_int * len(codes))(*codes)
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._cluster, api_key, len(codes), errors
        )

    def close(self) -> None:
        self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
        self._lib.rd_kafka_destroy(self._rk)
