"""The fault proxy's pure parts: which requests are object writes, which attempts fail."""

import pytest

from chaos.faultproxy import FaultPlan, main, object_key


@pytest.mark.parametrize(
    ("method", "path", "query", "key"),
    [
        ("PUT", "/ckpt/checkpoints/acme/x.pt", "", "ckpt/checkpoints/acme/x.pt"),
        ("PUT", "/ckpt/a%20b", "", "ckpt/a b"),
        ("PUT", "/ckpt/big.pt", "partNumber=2&uploadId=abc", "ckpt/big.pt"),
        ("PUT", "/ckpt", "", None),  # CreateBucket
        ("PUT", "/ckpt/", "versioning", None),
        ("PUT", "/ckpt/x", "tagging", None),
        ("GET", "/ckpt/x", "", None),
        ("POST", "/ckpt/x", "uploads", None),
    ],
)
def test_object_writes_are_recognized(
    method: str, path: str, query: str, key: str | None
) -> None:
    assert object_key(method, path, query) == key


def test_faults_depend_on_key_and_attempt_not_on_order() -> None:
    keys = [f"b/k{i}" for i in range(2000)]
    a, b = FaultPlan(share=0.25, seed=7), FaultPlan(share=0.25, seed=7)
    first = {k: a.fails(k) for k in keys}
    second = {k: b.fails(k) for k in reversed(keys)}
    assert first == second
    assert 0.2 < sum(first.values()) / len(keys) < 0.3
    assert FaultPlan(share=0.0).fails("b/k") is False


def test_faults_per_key_can_be_capped() -> None:
    plan = FaultPlan(share=0.99, seed=1, max_faults_per_key=1)
    outcomes = [plan.fails("b/k") for _ in range(5)]
    assert outcomes.count(True) == 1 and outcomes[-1] is False


@pytest.mark.parametrize(
    "argv",
    [
        ["--upstream", "ftp://x", "--fault-share", "0.1"],
        ["--upstream", "http://127.0.0.1:1", "--fault-share", "1.5"],
        ["--upstream", "http://127.0.0.1:1", "--max-faults", "-1"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("faultproxy: ") and "\n" not in err
