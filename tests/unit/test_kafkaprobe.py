"""What a Kafka refusal says: one line naming the cause and the setting, never a secret.
(The refusals themselves, from a real broker, are tests/e2e/test_kafka_secured.py.)"""

from __future__ import annotations

import ssl
from pathlib import Path

from aiokafka import errors

from reclaimd.kafkaconn import KafkaSettings
from reclaimd.kafkaprobe import _cause, explain


def _scram(tmp_path: Path) -> KafkaSettings:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value")
    return KafkaSettings.model_validate(
        {
            "security_protocol": "SASL_SSL",
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "reclaimd", "password_file": pw},
        }
    )


def test_acl_denials_name_the_resource(tmp_path: Path) -> None:
    s = _scram(tmp_path)
    assert (
        explain(errors.TopicAuthorizationFailedError(), s, "reclaimd.restart-waste")
        == "ACL: the broker denies user reclaimd on the topic reclaimd.restart-waste"
    )
    assert explain(errors.TransactionalIdAuthorizationFailed(), s) == (
        "ACL: the broker denies user reclaimd on the transactional id"
    )
    assert explain(errors.GroupAuthorizationFailedError(), None) == (
        "ACL: the broker denies our principal on the consumer group"
    )


def test_sasl_and_tls_refusals(tmp_path: Path) -> None:
    s = _scram(tmp_path)
    said = explain(errors.SaslAuthenticationFailed(), s)
    assert said == (
        "SASL: authentication failed for user reclaimd (SCRAM-SHA-512); "
        "check kafka.sasl.username and password_file"
    )
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    assert explain(untrusted, s) == (
        "TLS: the broker's certificate is not trusted (unable to get local issuer "
        "certificate); check kafka.tls.ca_file (system CAs)"
    )
    refused = ssl.SSLError(1, "alert")
    refused.reason = "SSLV3_ALERT_CERTIFICATE_EXPIRED"
    assert explain(refused, s) == (
        "TLS: the broker refused our client certificate (certificate expired); "
        "check kafka.tls.cert_file (none sent)"
    )
    assert "s3cret" not in said


def test_what_may_pass_by_itself_is_no_problem() -> None:
    assert explain(errors.KafkaConnectionError("Unable to bootstrap"), None) is None
    assert explain(errors.KafkaTimeoutError(), None) is None
    assert explain(ConnectionRefusedError(), None) is None


def test_the_cause_under_aiokafka_wrapping_is_found() -> None:
    inner = ssl.SSLCertVerificationError(1, "x")
    try:
        try:
            raise inner
        except ssl.SSLError as e:
            raise errors.KafkaConnectionError("wrapped") from e
    except errors.KafkaConnectionError as outer:
        assert _cause(outer) is inner
