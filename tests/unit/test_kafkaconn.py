"""The ``kafka:`` settings: what check-config refuses, the client keywords, MSK IAM tokens."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from reclaimd import config
from reclaimd.kafkaconn import KafkaConfigError, KafkaSettings, MskIamTokens, options
from reclaimd.kafkaprobe import explain

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE / "deploy" / "local" / "kafka"))
import pki  # noqa: E402 (the local stack's certificate maker: real PEM files for the tests)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.make(d)
    return d


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "c.yaml"
    f.write_text(text + "\nkueue: {enabled: true}\n")  # a source: check-config wants one
    return subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "check-config", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("kafka", "says"),
    [
        ("{security_protocol: SSL, tls: {ca_file: /nope/ca.crt}}", "ca_file /nope/ca.crt: no such"),
        ("{security_protocol: SASL_SSL}", "SASL_SSL needs a sasl section"),
        (
            "{security_protocol: SASL_SSL, sasl: {mechanism: SCRAM-SHA-512, username: r}}",
            "SCRAM-SHA-512: set password_file",
        ),
        (
            "{security_protocol: SSL, sasl: {mechanism: OAUTHBEARER, msk_iam_region: x}}",
            "SSL takes no SASL mechanism",
        ),
        ("{security_protocol: PLAINTEXT, tls: {check_hostname: false}}", "PLAINTEXT is not TLS"),
        (
            "{security_protocol: SASL_PLAINTEXT, sasl: {mechanism: OAUTHBEARER, "
            "msk_iam_region: us-east-1}}",
            "served over TLS only",
        ),
        ("{security_protocol: SASL_SSL, sasl: {mechanism: GSSAPI}}", "mechanism"),
        ("{security_protocol: TLS}", "security_protocol"),
    ],
)
def test_a_bad_kafka_section_is_one_line_and_exit_2(tmp_path: Path, kafka: str, says: str) -> None:
    out = _check(tmp_path, f"kafka: {kafka}\n")
    assert out.returncode == 2, out
    assert says in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_mtls_needs_both_halves(tmp_path: Path, certs: Path) -> None:
    out = _check(
        tmp_path,
        f"kafka: {{security_protocol: SSL, tls: {{cert_file: {certs / 'client.crt'}}}}}\n",
    )
    assert out.returncode == 2
    assert "cert_file and key_file" in out.stderr


def test_check_config_names_the_shape_never_the_password(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2-very-secret\n")
    out = _check(
        tmp_path,
        "kafka:\n  security_protocol: SASL_SSL\n"
        f"  sasl: {{mechanism: SCRAM-SHA-512, username: reclaimd, password_file: {secret}}}\n",
    )
    assert out.returncode == 0, out.stderr
    assert "SASL_SSL ca=system SCRAM-SHA-512 user=reclaimd" in out.stdout
    assert "hunter2" not in out.stdout + out.stderr


def test_environment_overrides_reach_the_section(tmp_path: Path, certs: Path) -> None:
    s = config.load(
        None,
        {
            "RECLAIMD_KAFKA__SECURITY_PROTOCOL": "SSL",
            "RECLAIMD_KAFKA__TLS__CA_FILE": str(certs / "ca.crt"),
        },
    )
    assert s.kafka.security_protocol == "SSL"
    assert s.kafka.tls.ca_file == certs / "ca.crt"


def test_plaintext_is_only_the_bootstrap() -> None:
    assert options(None, "b:9092") == {"bootstrap_servers": "b:9092"}
    assert options(KafkaSettings(), "b:9092") == {
        "bootstrap_servers": "b:9092",
        "security_protocol": "PLAINTEXT",
    }


def test_sasl_ssl_with_a_private_ca_and_a_client_certificate(certs: Path) -> None:
    pw = certs / "reclaimd.password"
    s = KafkaSettings.model_validate(
        {
            "security_protocol": "SASL_SSL",
            "tls": {
                "ca_file": certs / "ca.crt",
                "cert_file": certs / "client.crt",
                "key_file": certs / "client.key",
            },
            "sasl": {"mechanism": "SCRAM-SHA-256", "username": "reclaimd", "password_file": pw},
        }
    )
    opts = options(s, "h:9096")
    context = opts.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert opts == {
        "bootstrap_servers": "h:9096",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "reclaimd",
        "sasl_plain_password": pw.read_text().strip(),
    }


def test_the_password_file_is_read_for_each_new_client(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("first\n")
    s = KafkaSettings.model_validate(
        {
            "security_protocol": "SASL_SSL",
            "sasl": {"mechanism": "PLAIN", "username": "u", "password_file": pw},
        }
    )
    assert options(s, "h:1")["sasl_plain_password"] == "first"
    pw.write_text("rotated\n")
    assert options(s, "h:1")["sasl_plain_password"] == "rotated"
    pw.unlink()
    with pytest.raises(KafkaConfigError) as e:
        options(s, "h:1")
    assert str(e.value) == f"kafka.sasl.password_file {pw}: no such file or directory"


def test_a_key_that_does_not_load_is_one_line_without_its_content(
    tmp_path: Path, certs: Path
) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot-a-key\n-----END PRIVATE KEY-----\n")
    s = KafkaSettings.model_validate(
        {
            "security_protocol": "SSL",
            "tls": {"cert_file": certs / "client.crt", "key_file": bad},
        }
    )
    with pytest.raises(KafkaConfigError) as e:
        options(s, "h:1")
    assert str(e.value).startswith("kafka.tls: cannot load")
    assert "not-a-key" not in str(e.value)
    assert explain(e.value, s) == str(e.value)


class _Signer:
    def __init__(self, clock: list[float], life_s: float) -> None:
        self.clock, self.life_s, self.calls = clock, life_s, 0

    def __call__(self, region: str) -> tuple[str, int]:
        self.calls += 1
        return f"token-{region}-{self.calls}", int((self.clock[0] + self.life_s) * 1000)


async def test_msk_iam_tokens_are_kept_and_refreshed_before_they_expire() -> None:
    now = [1000.0]
    signer = _Signer(now, life_s=900)
    tokens = MskIamTokens("eu-west-1", signer=signer, refresh_before_s=60, clock=lambda: now[0])
    # Many clients asking at once: one signing.
    got = await asyncio.gather(*(tokens.token() for _ in range(20)))
    assert set(got) == {"token-eu-west-1-1"}
    assert signer.calls == 1
    now[0] += 839  # 61 s before expiry: still kept
    assert await tokens.token() == "token-eu-west-1-1"
    now[0] += 2  # 59 s before expiry: signed anew
    assert await tokens.token() == "token-eu-west-1-2"
    assert signer.calls == 2


async def test_the_real_msk_signer_makes_a_connect_token_for_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The library signs locally (SigV4 presigned URL) from the default credential chain:
    # static keys here stand in for IRSA's. It was not run against an MSK cluster.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    tokens = MskIamTokens("eu-central-1")
    token = await tokens.token()
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    assert parsed.netloc == "kafka.eu-central-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith("AKIDEXAMPLE/")
    assert "/eu-central-1/kafka-cluster/" in query["X-Amz-Credential"][0]
    assert tokens.signed == 1
    assert "wJalrXUtnFEMI" not in token  # the secret signs; it is never sent
