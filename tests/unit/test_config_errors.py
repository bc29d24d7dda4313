"""``check-config`` on the files a new user gets wrong: every error at once, one line each,
naming the file and key (or the ``RECLAIMD_*`` variable that set the value), with what to do;
an enabled source without what it needs to hear anything is an error, and so is a file that
enables no source. Run as a user runs it: a process, its exit code, its stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reclaimd import config

QUEUE = "https://sqs.us-east-2.amazonaws.com/123456789012/reclaimd-interruptions"
NONE_ENABLED = (
    "no source is enabled, so this replica would hear no notice: set enabled: true under one of"
)


def check(tmp_path: Path, text: str, **env: str) -> tuple[int, list[str], str]:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "reclaimd.cli", "check-config", str(f)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    prefix = f"reclaimd check-config: {f}: "
    lines = [line.removeprefix(prefix) for line in r.stderr.splitlines()]
    return r.returncode, lines, r.stdout


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (
            "sqs: {enabled: true}",
            [
                "sqs.queue_url: not set: set it to the queue's URL,"
                " https://sqs.<region>.amazonaws.com/<account>/<queue>"
            ],
        ),
        (
            "sqs: {enabled: true, queue_url: not-a-url}",
            [
                "sqs.queue_url: 'not-a-url' is not an http(s) URL: set it to the queue's URL,"
                " https://sqs.<region>.amazonaws.com/<account>/<queue>"
            ],
        ),
        (
            "sqs: {enabled: true, queue_url: 'https://sqs.us-east-2.amazonaws.com/reclaimd'}",
            [
                "sqs.queue_url: 'https://sqs.us-east-2.amazonaws.com/reclaimd' names no"
                " <account>/<queue>: set it to the queue's URL,"
                " https://sqs.<region>.amazonaws.com/<account>/<queue>"
            ],
        ),
        (
            "pubsub: {enabled: true, subscription: reclaimd}",
            ["pubsub.project: not set: set it to the Google Cloud project of the subscription"],
        ),
        (
            "pubsub: {enabled: true, project: p, subscription: projects/p/subscriptions/s}",
            ["pubsub.subscription: a path: set it to the subscription id alone"],
        ),
        (
            "kafka_notices: {enabled: true}",
            [
                "kafka_notices.bootstrap: not set: set it to the notices' brokers,"
                " host:port[,host:port]"
            ],
        ),
        (
            "imds: {enabled: true, url: '169.254.169.254'}",
            [
                "imds.url: '169.254.169.254' is not"
                " an http(s) URL: set it to IMDS, http://169.254.169.254"
            ],
        ),
        ("cluster_name: prod", [NONE_ENABLED]),
        ("", [NONE_ENABLED]),
        ("sqs: {enabled: false, queue_url: x}", [NONE_ENABLED]),
    ],
)
def test_a_source_without_what_it_needs_is_refused(
    tmp_path: Path, text: str, lines: list[str]
) -> None:
    code, got, _ = check(tmp_path, text)
    assert code == 2
    got = [line.split(" one of")[0] + " one of" if NONE_ENABLED in line else line for line in got]
    assert got == lines


def test_every_error_at_once_with_did_you_mean(tmp_path: Path) -> None:
    code, got, _ = check(
        tmp_path,
        f"sqs:\n  enabled: true\n  queue_ulr: {QUEUE}\n  wait_time_s: 30\npolcy: {{}}\n"
        "pubsub: {enabled: true}\nkube: {zzz: 1}\n",
    )
    assert code == 2
    assert sorted(got) == sorted(
        [
            "sqs.wait_time_s: Input should be less than or equal to 20",
            "sqs.queue_ulr: not a setting: did you mean sqs.queue_url?",
            "polcy: not a setting: did you mean policy?",
            "kube.zzz: not a setting: remove it (the keys here: attempt_timeout_s, burst,"
            " connections, forbidden_grace_s, growth_per_s, kubeconfig, max_attempts,"
            " max_conflicts, max_in_flight, min_qps, qps, retry_base_s, ...)",
            "pubsub.project: not set: set it to the Google Cloud project of the subscription",
            "pubsub.subscription: not set: set it to the subscription id on the Logging sink's"
            " topic (not its path)",
        ]
    )


def test_a_value_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    code, got, _ = check(
        tmp_path,
        f"sqs: {{enabled: true, queue_url: {QUEUE}}}\n",
        RECLAIMD_SQS__WAIT_TIME_S="forever",
        RECLAIMD_SQS__QUEUE_ULR="x",
        RECLAIMD_PUBSUB__ENABLED="true",
        RECLAIMD_STACK_DIR="/tooling/not/a/setting",
    )
    assert code == 2
    # the variables by name (the file set neither); what the file lacks by the file, with
    # the variable that enabled the source
    prefix = "reclaimd check-config: "
    assert [line.removeprefix(prefix) for line in got] == [
        "RECLAIMD_SQS__WAIT_TIME_S (sqs.wait_time_s): Input should be a valid integer,"
        " unable to parse string as an integer",
        "RECLAIMD_SQS__QUEUE_ULR (sqs.queue_ulr): not a setting: did you mean sqs.queue_url?",
        "pubsub.project: not set: set it to the Google Cloud"
        " project of the subscription (enabled by RECLAIMD_PUBSUB__ENABLED)",
        "pubsub.subscription: not set: set it to the subscription id"
        " on the Logging sink's topic (not its path) (enabled by RECLAIMD_PUBSUB__ENABLED)",
    ]


def test_a_good_file_is_ok(tmp_path: Path) -> None:
    code, got, out = check(
        tmp_path, f"cluster_name: prod\nsqs: {{enabled: true, queue_url: {QUEUE}}}\n"
    )
    assert (code, got) == (0, [])
    assert out.startswith(f"{tmp_path / 'c.yaml'}: ok (cluster prod")


def test_load_without_require_source_lets_a_tool_read_an_idle_file(tmp_path: Path) -> None:
    """``reclaimd parse --config`` reads the windows of a file that enables nothing."""
    f = tmp_path / "c.yaml"
    f.write_text("windows: {default_s: 60}\n")
    assert config.load(f, env={}).windows.default_s == 60
    with pytest.raises(config.ConfigError, match="no source is enabled"):
        config.load(f, env={}, require_source=True)


def test_a_wrong_type_says_what_to_write(tmp_path: Path) -> None:
    code, got, _ = check(
        tmp_path,
        "sqs: 5\nkueue: {enabled: maybe, namespaces: default}\npolicy: {eviction: yolo}\n",
    )
    assert code == 2
    assert sorted(got) == [
        "kueue.enabled: write true or false",
        "kueue.namespaces: a list: write [a, b] or one '- item' line each",
        "policy.eviction: Input should be 'respect-pdb' or 'force-near-deadline'",
        "sqs: a section: write its keys under it (key: value), or leave it out",
    ]
