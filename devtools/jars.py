"""The Kafka broker's jars: fetched once from Maven Central into a cache dir outside git.
How: docs/local-kafka.md, "Local broker"."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from codeclog.errors import CodeclogError
from codeclog.paths import default_cache_dir

KAFKA_VERSION = "4.3.1"
ENV_KAFKA_LIBS = "CODECLOG_KAFKA_LIBS"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT_S = 900.0

# Jars whose absence means the cache is not a usable broker classpath.
REQUIRED_JARS: tuple[str, ...] = (
    f"kafka_2.13-{KAFKA_VERSION}.jar",
    f"kafka-clients-{KAFKA_VERSION}.jar",
    f"kafka-server-{KAFKA_VERSION}.jar",
    "log4j-api-2.25.4.jar",
    "log4j-core-2.25.4.jar",
    "log4j-slf4j-impl-2.25.4.jar",
    "slf4j-api-1.7.36.jar",
)
# A second SLF4J binding or a test jar on the classpath silently breaks broker logging.
FORBIDDEN_JAR_PREFIXES: tuple[str, ...] = ("log4j-slf4j2-impl", "slf4j-reload4j", "logback")
TEST_JAR_SUFFIXES: tuple[str, ...] = ("-test.jar", "-test-sources.jar", "-tests.jar")


class KafkaJarsError(CodeclogError):
    """The broker's jars are missing and could not be fetched."""


class MavenNotFoundError(KafkaJarsError):
    """`mvn` is needed for the first fetch and is not installed."""


class JarFetchError(KafkaJarsError):
    """Maven ran but could not fetch the jars (usually no access to Maven Central)."""


class JarCacheInvalidError(KafkaJarsError):
    """The cache dir exists but is not the expected classpath."""


def runtime_file(name: str) -> Path:
    """A file shipped in devtools/kafka_rt (pom.xml, log4j2.properties,
    tools-log4j2.properties)."""
    return Path(str(resources.files("codeclog.devtools.kafka_rt").joinpath(name)))


def default_libs_dir() -> Path:
    env = os.environ.get(ENV_KAFKA_LIBS)
    if env:
        return Path(env)
    return default_cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


@dataclasses.dataclass(frozen=True)
class JarFetcher:
    """Where the jars live and how Maven is run to get them."""

    libs_dir: Path = dataclasses.field(default_factory=default_libs_dir)
    mvn: str = "mvn"  # executable name or path
    maven_args: tuple[str, ...] = ()  # extra Maven options, e.g. ("-o",) or a settings file
    timeout_s: float = FETCH_TIMEOUT_S

    def ensure(self, progress: Callable[[str], None] = lambda _msg: None) -> Path:
        """Return the verified libs dir, fetching it first when missing."""
        if not self.libs_dir.exists():
            progress(
                f"fetching the Kafka {KAFKA_VERSION} jars with Maven into {self.libs_dir} "
                "(first run only, about 30 s)"
            )
            self._fetch()
        verify_libs(self.libs_dir)
        return self.libs_dir

    def _fetch(self) -> None:
        mvn = shutil.which(self.mvn)
        if mvn is None:
            raise MavenNotFoundError(
                f"Maven (`{self.mvn}`) is needed once to fetch the Kafka jars into "
                f"{self.libs_dir} but was not found on PATH; install it "
                "(e.g. `apt-get install maven`)"
            )
        self.libs_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".libs-", dir=self.libs_dir.parent))
        try:
            self._run_maven(mvn, staging / "libs")
            _publish(staging / "libs", self.libs_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _run_maven(self, mvn: str, output_dir: Path) -> None:
        command = [
            mvn,
            "-B",
            "-q",
            *self.maven_args,
            "-f",
            str(runtime_file("pom.xml")),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={output_dir}",
        ]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise JarFetchError(
                f"Maven did not finish fetching the Kafka jars within {self.timeout_s:.0f} s "
                "(is Maven Central reachable from this machine?)"
            ) from exc
        if done.returncode != 0 or not output_dir.is_dir():
            raise JarFetchError(
                "Maven could not fetch the Kafka jars (is Maven Central reachable from this "
                f"machine?): {first_maven_error(done.stdout + done.stderr)}"
            )


def _publish(staged: Path, libs_dir: Path) -> None:
    """Move a complete fetch into place; a concurrent fetch that won the race is kept."""
    verify_libs(staged)
    try:
        staged.rename(libs_dir)
    except OSError:
        if not libs_dir.is_dir():
            raise


def verify_libs(libs_dir: Path) -> None:
    if not libs_dir.is_dir():
        raise JarCacheInvalidError(f"the Kafka jar dir {libs_dir} does not exist")
    names = {path.name for path in libs_dir.iterdir()}
    missing = [jar for jar in REQUIRED_JARS if jar not in names]
    if missing:
        raise JarCacheInvalidError(
            f"the Kafka jar dir {libs_dir} lacks {', '.join(missing)}; "
            "delete it and run `codeclog broker fetch` again"
        )
    bad = sorted(
        n for n in names if n.startswith(FORBIDDEN_JAR_PREFIXES) or n.endswith(TEST_JAR_SUFFIXES)
    )
    if bad:
        raise JarCacheInvalidError(
            f"the Kafka jar dir {libs_dir} holds jars that break the broker: {', '.join(bad)}"
        )


def first_maven_error(output: str) -> str:
    """The most telling line of Maven's output (its first [ERROR] line), trimmed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("[ERROR]")]
    chosen = errors[0] if errors else (lines[-1] if lines else "no output")
    chosen = chosen.removeprefix("[ERROR]").strip()
    return chosen if len(chosen) <= 400 else chosen[:397] + "..."
