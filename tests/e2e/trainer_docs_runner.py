"""Runs docs/checkpoint-contract.md's trainer snippets where only the SDK is installed.

``python trainer_docs_runner.py DOC BUCKET WORKDIR``, in test_trainer_docs.py's venv (the
reclaimd-trainer wheel and what its extras need; no reclaimd, no chaos, no pytest): the
snippets run as written, in order, in one namespace. When a snippet's server is up and its loop
has taken a few steps, one line ``@reclaimd-docs {"ask": url, "phase": ...}`` on stdout tells
the test to ask it (with reclaimd's own signaller); after the plain loop, the test writes back
the step its ack named, on stdin. Other such lines report what the test checks. Exit 0 when
all ran.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from transformers import TrainingArguments

SECTION = "## Trainer side in a few lines: `reclaimd_trainer`"


MARK = "@reclaimd-docs "  # the frameworks print to stdout too (HF: a dict of metrics)


def emit(**doc: Any) -> None:
    print(MARK + json.dumps(doc), flush=True)


def snippets(doc: Path) -> list[str]:
    text = doc.read_text()
    return re.findall(r"```python\n(.*?)```", text[text.index(SECTION) :], re.S)


# --- the reader's model, data and loop (what the docs call "yours") -----------------------


def build_model(hidden: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    mods: list[nn.Module] = [nn.Linear(32, hidden), nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7 * 1_000_003 + step * 101)
    x = torch.randn(16, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_model(64, 2, 7)

    def training_step(self, b: Any, batch_idx: int) -> torch.Tensor:
        x, y = b
        loss: torch.Tensor = nn.functional.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class SlowBatches(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Any:
        for step in range(100_000):
            time.sleep(0.02)
            yield batch(step)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_model(32, 1, 7)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(0.02)
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def namespace(bucket: str, work: Path) -> dict[str, Any]:
    model = build_model(64, 2, 7)
    first_steps: list[int] = []

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        first_steps.append(step)
        x, y = batch(step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        time.sleep(0.02)

    xs = torch.randn(8192, 32, generator=torch.Generator().manual_seed(0))
    return {
        "tenant": "team-a",
        "bucket": bucket,
        "stash_dir": str(work / "stash-0"),
        "port": 0,
        "steps": 200,
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "train_step": train_step,
        "first_steps": first_steps,
        "module": Module(),
        "data": DataLoader(SlowBatches(), batch_size=None),
        "hf_model": Tiny(),
        "args": TrainingArguments(
            output_dir=str(work / "hf"),
            max_steps=200,
            per_device_train_batch_size=16,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            logging_strategy="no",
            disable_tqdm=True,
        ),
        "dataset": [{"x": x, "labels": x.sum().sin().reshape(1)} for x in xs],
    }


# --- running a snippet while the test asks ------------------------------------------------


def run_and_ask(code: str, ns: dict[str, Any], phase: str, up: Callable[[], str | None]) -> None:
    """Run ``code`` in a thread; once ``up()`` names a URL, ask for it; wait for the end."""
    errors: list[BaseException] = []

    def go() -> None:
        try:
            exec(code, ns)
        except BaseException as e:  # reported below, with the phase
            errors.append(e)

    t = threading.Thread(target=go)
    t.start()
    end = time.monotonic() + 300
    url = None
    while url is None and not errors and t.is_alive() and time.monotonic() < end:
        url = up()
        time.sleep(0.02)
    if url is None:
        t.join(5)
        raise RuntimeError(f"{phase}: never served a few steps: {errors or 'timeout'}")
    emit(ask=url, phase=phase)
    t.join(300)
    if errors:
        raise RuntimeError(f"{phase}: {errors[0]!r}") from errors[0]


def after_steps(ns: dict[str, Any], name: str, steps: Callable[[Any], int]) -> str | None:
    """The Signal's URL once ``ns[name]`` exists and has taken a few steps."""
    obj = ns.get(name)
    return ns["signal"].url if obj is not None and steps(obj) >= 3 else None


def main(doc: Path, bucket: str, work: Path) -> None:
    plain, lightning, hf, aio = snippets(doc)
    ns = namespace(bucket, work)

    steps_taken = lambda _: len(ns["first_steps"])  # noqa: E731
    run_and_ask(plain, ns, "plain", lambda: after_steps(ns, "signal", steps_taken))
    # The same loop on a new node (a fresh stash), up to the step the test names: it restores
    # the saved step from the bucket.
    asked = int(sys.stdin.readline())
    ns["signal"].stop()
    ns["stash_dir"] = str(work / "stash-1")
    ns["first_steps"].clear()
    ns["steps"] = asked + 3
    exec(plain, ns)
    emit(phase="plain-again", first_step=ns["first_steps"][0])

    ns["steps"] = 200
    ns.pop("trainer", None)
    lightning_up = lambda: after_steps(ns, "trainer", lambda t: t.global_step)  # noqa: E731
    run_and_ask(lightning, ns, "lightning", lightning_up)
    emit(phase="lightning-saved", step=ns["reclaimd_cb"].saves[0].step)

    ns.pop("trainer", None)
    run_and_ask(hf, ns, "hf", lambda: after_steps(ns, "trainer", lambda t: t.state.global_step))
    emit(phase="hf-saved", step=ns["reclaimd_cb"].saves[0].step)

    ns["trainer_loop"] = lambda: asyncio.sleep(6)
    exec(aio, ns)
    servers: list[Any] = []
    real = ns["CheckpointServer"]

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            servers.append(self)

    ns["CheckpointServer"] = Recorded  # the real server, remembered to learn its URL
    run_and_ask(
        "import asyncio\nasyncio.run(main())",
        ns,
        "aio",
        lambda: servers[0].url if servers and servers[0].port != 0 else None,
    )
    emit(phase="aio-saved", saves=servers[0].save_count)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
