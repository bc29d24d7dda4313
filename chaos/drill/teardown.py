"""Tearing a drill down (``chaos.drill.run``, last): what the world built, taken down again,
started or not, and the shared stack left healthy for the next run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaos.drill.local import World
    from chaos.harness import Harness


async def teardown(h: Harness, world: World, *, stop_pods: Sequence[asyncio.Task[None]]) -> None:
    """Leave the machine as the drill found it, whatever state the run ended in: replicas
    continued, the shared stack up, the pods' stoppers cancelled, the mocks, clients, Pub/Sub
    topic, subscriptions and slot Leases and the proxies gone, the run's namespace deleted."""
    from chaos import fleet
    from chaos.drill import faults
    from chaos.drill.scenario import STACK_FAULTS

    for d in h.daemons:
        if d.paused:
            d.resume()
    if any(f.kind in STACK_FAULTS for f in world.scenario.faults):  # on_claim has no replica
        with contextlib.suppress(faults.FaultError):
            await faults.ensure_stack_up(world.stack)  # leave the shared stack healthy
    for task in stop_pods:
        task.cancel()
    for mock in world.built.imds.values():
        await mock.stop()
    for server in world.built.gce.values():
        await server.stop()
    for azure in world.built.azure.values():
        await azure.stop()
    if world.producer is not None:
        await world.producer.stop()
    if world.publisher is not None:
        await asyncio.to_thread(pubsub_cleanup, world)
        await slot_leases_cleanup(h, world)
    for proxy in world.proxies:
        await proxy.stop()
    if h.api is not None:
        with contextlib.suppress(Exception):
            await fleet.delete_namespace(h.api, h.namespace)


def pubsub_cleanup(world: World) -> None:
    """Delete the run's subscriptions and topic (the emulator keeps them otherwise)."""
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    for sub_id in world.pubsub_subscriptions():
        path = subscriber.subscription_path(world.stack["PUBSUB_PROJECT_ID"], sub_id)
        with contextlib.suppress(Exception):
            subscriber.delete_subscription(subscription=path)
    subscriber.close()
    with contextlib.suppress(Exception):
        world.publisher.delete_topic(topic=world.built.pubsub_topic)


async def slot_leases_cleanup(h: Harness, world: World) -> None:
    """Delete the run's Pub/Sub slot Leases (named for its subscriptions: nobody else's)."""
    from kubernetes_asyncio import client as k8s

    from reclaimd.cluster import slots
    from reclaimd.config import Settings

    if h.api is None or world.pubsub_slots == 1:
        return
    coord = k8s.CoordinationV1Api(h.api)
    default = Settings.model_fields["lease_namespace"].default
    namespace = str(world.scenario.reclaimd.settings.get("lease_namespace", default))
    for sub_id in world.pubsub_subscriptions():
        with contextlib.suppress(Exception):
            await coord.delete_namespaced_lease(slots.lease_name(sub_id), namespace)
