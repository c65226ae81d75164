"""A secured local broker: SASL_SSL with SCRAM-SHA-512, TLS from a local CA, one user per role.
Its files, users and listeners: docs/security.md, "The secured local broker"."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from codeclog.devtools.broker_errors import SecurityModeError
from codeclog.errors import CodeclogError, UsageError

SECURITY_NONE = "none"
SECURITY_SCRAM = "scram"
SECURITY_CHOICES = (SECURITY_NONE, SECURITY_SCRAM)
MECHANISM = "SCRAM-SHA-512"
SUPER_USER = "admin"
ROLES = ("talker", "vocoder", "monitor", "replay")
SECURITY_DIR = "security"
BROKER_DN = "CN=codeclog-broker"
CA_DN = "CN=codeclog-local-ca"
CERT_VALIDITY_DAYS = 825
KEYTOOL_TIMEOUT_S = 120.0
CLIENT_LISTENER = "SASL_SSL"
CONTROLLER_LISTENER = "CONTROLLER"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class SecurityError(CodeclogError):
    """The local CA, certificates or credentials could not be made or read."""


class UnknownSecurityError(UsageError):
    """An unknown --security mode."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Passwords of the super user and every role, and of the PKCS12 stores."""

    store_password: str
    passwords: tuple[tuple[str, str], ...]  # (user, password), the super user first

    def password(self, user: str) -> str:
        return dict(self.passwords)[user]

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(user for user, _ in self.passwords)

    def to_json(self) -> str:
        return json.dumps(
            {"store_password": self.store_password, "passwords": dict(self.passwords)}, indent=2
        )

    @classmethod
    def from_json(cls, text: str) -> Credentials:
        raw = json.loads(text)
        return cls(str(raw["store_password"]), tuple(raw["passwords"].items()))

    @classmethod
    def fresh(cls, token: Callable[[int], str] = secrets.token_hex) -> Credentials:
        # Hex only: safe inside the JAAS line, --add-scram's [name=...,password=...] syntax
        # and properties files, with no quoting rules to get wrong.
        users = (SUPER_USER, *ROLES)
        return cls(token(16), tuple((user, token(16)) for user in users))


@dataclasses.dataclass(frozen=True)
class SecurityFiles:
    """Paths of the security material of one data dir (`security_files` names them)."""

    root: Path
    ca_keystore: Path
    ca_pem: Path
    broker_keystore: Path
    truststore: Path
    credentials: Path

    def role_properties(self, user: str) -> Path:
        return self.root / f"{user}.properties"

    def complete(self) -> bool:
        paths = (self.ca_pem, self.broker_keystore, self.truststore, self.credentials)
        return all(path.exists() for path in paths)


def check_mode(mode: str) -> str:
    if mode not in SECURITY_CHOICES:
        raise UnknownSecurityError(
            f"unknown security mode {mode!r}; choose one of {', '.join(SECURITY_CHOICES)}"
        )
    return mode


def start_mode(asked: str | None, formatted: bool, files: SecurityFiles, data_dir: Path) -> str:
    """The mode a start of the broker in `data_dir` uses: the one asked for (none when nothing
    is) in a data dir not formatted yet; else the one it was formatted with (scram when its
    `files` are complete), which must be the one asked for, if any."""
    if not formatted:
        return asked or SECURITY_NONE
    held = SECURITY_SCRAM if files.complete() else SECURITY_NONE
    if asked is not None and asked != held:
        raise SecurityModeError(
            f"{data_dir} holds a broker formatted with --security {held}; it cannot "
            f"start with --security {asked} (users are created at format "
            "time): use another --data-dir"
        )
    return held


def security_files(data_dir: Path) -> SecurityFiles:
    root = Path(data_dir) / SECURITY_DIR
    return SecurityFiles(
        root,
        ca_keystore=root / "ca.p12",
        ca_pem=root / "ca.pem",
        broker_keystore=root / "broker.p12",
        truststore=root / "truststore.p12",
        credentials=root / "credentials.json",
    )


# ----------------------------------------------------------------------------- pure renderers


def jaas_line(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def server_security_properties(
    broker_port: int, controller_port: int, host: str, files: SecurityFiles, creds: Credentials
) -> dict[str, str]:
    """The listener, TLS, SASL and authorizer properties of a secured single node."""
    store = creds.store_password
    return {
        "listeners": f"{CLIENT_LISTENER}://{host}:{broker_port},"
        f"{CONTROLLER_LISTENER}://{host}:{controller_port}",
        "advertised.listeners": f"{CLIENT_LISTENER}://{host}:{broker_port}",
        "inter.broker.listener.name": CLIENT_LISTENER,
        "controller.listener.names": CONTROLLER_LISTENER,
        "listener.security.protocol.map": f"{CONTROLLER_LISTENER}:SSL,{CLIENT_LISTENER}:SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.{CLIENT_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas_line(
            SUPER_USER, creds.password(SUPER_USER)
        ),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(files.broker_keystore),
        "ssl.keystore.password": store,
        "ssl.key.password": store,
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(files.truststore),
        "ssl.truststore.password": store,
        "ssl.endpoint.identification.algorithm": "https",
        # Mutual TLS between the broker and the controller: only the broker's key gets in.
        f"listener.name.{CONTROLLER_LISTENER.lower()}.ssl.client.auth": "required",
        "authorizer.class.name": AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{SUPER_USER};User:{BROKER_DN}",
    }


def client_properties(user: str, password: str, bootstrap: str, ca_pem: Path) -> dict[str, str]:
    """librdkafka properties for one SCRAM user of the secured local broker."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca_pem),
        "ssl.endpoint.identification.algorithm": "https",
    }


def admin_properties(files: SecurityFiles, creds: Credentials) -> dict[str, str]:
    """The super user's client properties, without bootstrap.servers (its client adds one)."""
    props = client_properties(SUPER_USER, creds.password(SUPER_USER), "", files.ca_pem)
    props.pop("bootstrap.servers")
    return props


def render_properties(props: Mapping[str, str], header: str) -> str:
    return "\n".join([f"# {header}", *(f"{k}={v}" for k, v in props.items())]) + "\n"


def scram_format_args(creds: Credentials) -> list[str]:
    """`StorageTool format` arguments that create every SCRAM user in the bootstrap metadata."""
    args: list[str] = []
    for user, password in creds.passwords:
        args += ["--add-scram", f'{MECHANISM}=[name={user},password="{password}"]']
    return args


# ----------------------------------------------------------------------------- keytool


def keytool_for(java: str) -> str:
    """The keytool next to `java` (same JDK), else the PATH's."""
    beside = Path(java).resolve().parent / "keytool"
    if beside.exists():
        return str(beside)
    found = shutil.which("keytool")
    if found is None:
        raise SecurityError(
            f"keytool was not found next to {java} nor on PATH; it ships with every JDK and is "
            "needed to make the local CA and the broker certificate"
        )
    return found


def ensure_material(files: SecurityFiles, keytool: str) -> Credentials:
    """Create the CA, the broker certificate and the credentials once; read them afterwards."""
    if files.complete():
        return read_credentials(files)
    if files.root.exists():
        shutil.rmtree(files.root)  # a half-made set from an interrupted start
    files.root.mkdir(mode=0o700, parents=True)
    creds = Credentials.fresh()
    _make_certificates(files, keytool, creds.store_password)
    _write_private(files.credentials, creds.to_json())
    return creds


def read_credentials(files: SecurityFiles) -> Credentials:
    try:
        return Credentials.from_json(files.credentials.read_text())
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise SecurityError(
            f"cannot read {files.credentials} ({exc}); delete {files.root} and the data dir's "
            "kafka/ to start over"
        ) from exc


def write_role_properties(
    files: SecurityFiles, creds: Credentials, bootstrap: str
) -> dict[str, Path]:
    """One properties file per user (the super user included); returns user -> path."""
    written: dict[str, Path] = {}
    for user, password in creds.passwords:
        path = files.role_properties(user)
        props = client_properties(user, password, bootstrap, files.ca_pem)
        header = f"codeclog role {user!r}: pass as --kafka-config (rewritten at broker start)"
        _write_private(path, render_properties(props, header))
        written[user] = path
    return written


def _make_certificates(files: SecurityFiles, keytool: str, store: str) -> None:
    common = ["-storetype", "PKCS12", "-storepass", store, "-keypass", store]
    validity = ["-validity", str(CERT_VALIDITY_DAYS), "-keyalg", "RSA", "-keysize", "2048"]
    ca, broker = str(files.ca_keystore), str(files.broker_keystore)
    _keytool(
        keytool,
        [
            "-genkeypair",
            "-alias",
            "ca",
            "-dname",
            CA_DN,
            "-ext",
            "bc:c",
            "-keystore",
            ca,
            *common,
            *validity,
        ],
    )
    ca_pem = _keytool(
        keytool, ["-exportcert", "-rfc", "-alias", "ca", "-keystore", ca, "-storepass", store]
    )
    _write_private(files.ca_pem, ca_pem)
    _keytool(
        keytool,
        [
            "-genkeypair",
            "-alias",
            "broker",
            "-dname",
            BROKER_DN,
            "-keystore",
            broker,
            *common,
            *validity,
        ],
    )
    request = _keytool(
        keytool, ["-certreq", "-alias", "broker", "-keystore", broker, "-storepass", store]
    )
    signed = _keytool(
        keytool,
        [
            "-gencert",
            "-rfc",
            "-alias",
            "ca",
            "-keystore",
            ca,
            "-storepass",
            store,
            "-ext",
            "SAN=ip:127.0.0.1,dns:localhost",
            "-validity",
            str(CERT_VALIDITY_DAYS),
        ],
        stdin=request,
    )
    for alias, store_path, pem in (
        ("ca", broker, ca_pem),
        ("broker", broker, signed),
        ("ca", str(files.truststore), ca_pem),
    ):
        _keytool(
            keytool,
            ["-importcert", "-noprompt", "-alias", alias, "-keystore", store_path, *common],
            stdin=pem,
        )
    for path in (files.ca_keystore, files.broker_keystore, files.truststore):
        path.chmod(0o600)


def _keytool(keytool: str, args: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            [keytool, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=KEYTOOL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SecurityError(f"keytool {args[0]} failed: {exc}") from exc
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[:300]
        raise SecurityError(f"keytool {args[0]} failed (exit {done.returncode}): {detail}")
    return done.stdout


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
