"""The pubsub source's settings: the Pub/Sub subscription(s) on a Cloud Logging sink of GCE
preemption and maintenance audit entries, and its slots."""

from __future__ import annotations

from pydantic import Field, model_validator

from reclaimd.handlers.entry import SourceSettings


class PubSubSettings(SourceSettings):
    """A Cloud Logging sink -> Pub/Sub subscription carrying GCE preemption audit entries."""

    project: str = ""
    subscription: str = ""  # the subscription id, not its full path
    max_messages: int = Field(100, ge=1)  # flow control: leased, unacked messages at most
    # The stream ack deadline and each lease extension (FlowControl's min and max): how long
    # a dead replica's messages stay leased. Pub/Sub allows 10..600; the client's 60 s default
    # is twice the GCE window.
    lease_extension_s: int = Field(10, ge=10, le=600)
    endpoint: str | None = None  # None: PUBSUB_EMULATOR_HOST or the real service
    # One subscription per replica, so that no message depends on one replica: with N > 1,
    # slot i consumes ``<subscription>-<i>`` (i = 0 .. N-1, all on the sink's topic; the
    # deployer creates them: deploy/gcp/main.tf) while this replica holds the slot's Lease
    # (``reclaimd.cluster.slots``), and the claim decides which replica acts. 1: every
    # replica shares ``<subscription>`` (a killed replica's messages wait out its lease).
    slots: int = Field(1, ge=1, le=64)
    # A replica taking a slot first seeks its subscription this far back (slots > 1 only):
    # what the slot's last holder had leased and not settled (it was killed) comes back at
    # once instead of after the lease, which on the emulator is 20-40 s. Unacked messages
    # published before that are dropped: older than any window plus policy.expired_after_s.
    # 0: no seek.
    rewind_s: int = Field(900, ge=0)

    def slot_subscription(self, index: int) -> str:
        """The subscription id slot ``index`` consumes (``subscription`` with one slot)."""
        if not 0 <= index < self.slots:
            raise ValueError(f"pubsub: slot {index} out of 0..{self.slots - 1}")
        return self.subscription if self.slots == 1 else f"{self.subscription}-{index}"

    @model_validator(mode="after")
    def _slot_names_fit(self) -> PubSubSettings:
        # A subscription id is at most 255 characters: the longest slot's must be one.
        longest = len(self.subscription) + (len(f"-{self.slots - 1}") if self.slots > 1 else 0)
        if longest > 255:
            raise ValueError("subscription: with its slot suffix longer than 255 characters")
        return self

    def destination(self) -> str:
        return self.subscription

    def needs(self) -> dict[str, str]:
        found = {}
        if not self.project:
            found["project"] = "not set: set it to the Google Cloud project of the subscription"
        if not self.subscription:
            found["subscription"] = (
                "not set: set it to the subscription id on the Logging sink's topic (not its path)"
            )
        elif "/" in self.subscription:
            found["subscription"] = "a path: set it to the subscription id alone"
        return found

    def check(self, *, dry_run: bool) -> None:
        # A slot is a Lease (a write), and a dry run must not take a live replica's slot.
        if dry_run and self.enabled and self.slots > 1:
            raise ValueError(
                "pubsub.slots: a dry run consumes one subscription of its own (slots: 1)"
            )
