"""The talker module is usable without a Kafka client: importing it loads no confluent_kafka."""

from __future__ import annotations

import sys

from tests.processes import run_in_tree

CHECK = (
    "import sys\n"
    "import {module}\n"
    "loaded = sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r})\n"
    "print(','.join(loaded))\n"
)


def _loaded_by(module: str, forbidden: tuple[str, ...]) -> str:
    code = CHECK.format(module=module, forbidden=forbidden)
    done = run_in_tree([sys.executable, "-c", code], timeout_s=120)
    done.check_returncode()
    return done.stdout.strip()


def test_importing_the_talker_loads_no_kafka_client() -> None:
    assert _loaded_by("producers.talker", ("confluent_kafka",)) == ""


def test_the_check_sees_a_kafka_import() -> None:
    # The same check on the publisher does find confluent_kafka: the check can fail.
    assert "confluent_kafka" in _loaded_by("producers.publisher", ("confluent_kafka",))
