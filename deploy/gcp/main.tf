# reclaimd's GCP side: a Cloud Logging sink publishes GCE preemption and host-maintenance
# System Event audit entries to a Pub/Sub topic; each reclaimd replica pulls them from a
# subscription of its own (a slot: config.pubsub.slots), so every replica gets every entry
# and a replica's death strands none (the durable claim decides which replica acts).
# The filter is the plain text beside this file (tested by tests/unit/test_deploy_gcp.py).

terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0"
    }
  }
}

variable "project" {
  description = "Project whose GCE instances (GKE nodes) reclaimd watches; the sink lives here."
  type        = string
}

variable "name" {
  description = "Name of the sink and topic, and of the subscriptions' stem (config.pubsub.subscription)."
  type        = string
  default     = "reclaimd-preemptions"
}

variable "replicas" {
  description = "reclaimd's controller replicas (the chart's controller.replicas): one subscription each, <name>-0 .. <name>-<replicas-1> (config.pubsub.slots); 1: a single subscription named <name>."
  type        = number
  default     = 2
  validation {
    condition     = var.replicas >= 1 && var.replicas <= 64 && floor(var.replicas) == var.replicas
    error_message = "replicas: a whole number from 1 to 64 (config.pubsub.slots allows 64)."
  }
}

variable "reclaimd_gsa_email" {
  description = "An existing Google service account for reclaimd (the Workload Identity GSA); empty: this module creates <gsa_account_id>@<project>.iam.gserviceaccount.com. Subscriber only."
  type        = string
  default     = ""
}

variable "gsa_account_id" {
  description = "The account id of the GSA this module creates when reclaimd_gsa_email is empty."
  type        = string
  default     = "reclaimd"
}

variable "workload_identity_ksa" {
  description = "\"<namespace>/<serviceaccount>\" of reclaimd's Kubernetes SA, or \"\" to bind it elsewhere."
  type        = string
  default     = "reclaimd/reclaimd"
}

# reclaimd's Google identity: it holds no key (Workload Identity) and no role but the
# subscriber bindings below.
resource "google_service_account" "reclaimd" {
  count        = var.reclaimd_gsa_email == "" ? 1 : 0
  project      = var.project
  account_id   = var.gsa_account_id
  display_name = "reclaimd (GKE preemption notices)"
}

locals {
  gsa_email = var.reclaimd_gsa_email != "" ? var.reclaimd_gsa_email : google_service_account.reclaimd[0].email
}

resource "google_pubsub_topic" "notices" {
  project = var.project
  name    = var.name
}

resource "google_logging_project_sink" "notices" {
  project                = var.project
  name                   = var.name
  destination            = "pubsub.googleapis.com/${google_pubsub_topic.notices.id}"
  filter                 = trimspace(file("${path.module}/preemption-filter.txt"))
  unique_writer_identity = true
}

# The sink's own writer identity may publish to this topic, nothing more.
resource "google_pubsub_topic_iam_member" "sink_publishes" {
  project = var.project
  topic   = google_pubsub_topic.notices.name
  role    = "roles/pubsub.publisher"
  member  = google_logging_project_sink.notices.writer_identity
}

# One per replica slot, all on the topic: each carries its own copy of every entry.
resource "google_pubsub_subscription" "reclaimd" {
  count   = var.replicas
  project = var.project
  name    = var.replicas == 1 ? var.name : "${var.name}-${count.index}"
  topic   = google_pubsub_topic.notices.id
  # Preemption leaves 30 s, so a message must not sit with a replica that died holding it.
  # 10 s is Pub/Sub's minimum: it bounds how long a delivery that reclaimd never extended
  # (the replica died first) waits before a peer gets it; 60 s was twice the window. reclaimd
  # extends its leases in steps of the same 10 s (config.pubsub.lease_extension_s) while a
  # claim is in flight, so the short deadline costs modacks, not redeliveries.
  # No retry_policy on purpose: a nack (a claim to retry, a stopping replica handing back what
  # it had not settled) is redelivered at once; a RetryPolicy would add 10 s or more.
  ack_deadline_seconds = 10
  # A notice older than the minimum retention is long past its deadline.
  message_retention_duration = "600s"
  expiration_policy {
    ttl = "" # never expire while reclaimd is idle (no preemptions for weeks is normal)
  }
}

# The single subscription of earlier versions is slot 0's resource now (renamed only when
# replicas > 1: then the old one is replaced by <name>-0 .. <name>-<replicas-1>).
moved {
  from = google_pubsub_subscription.reclaimd
  to   = google_pubsub_subscription.reclaimd[0]
}

moved {
  from = google_pubsub_subscription_iam_member.reclaimd_subscribes
  to   = google_pubsub_subscription_iam_member.reclaimd_subscribes[0]
}

# reclaimd's GSA consumes these subscriptions only: no topic, project or other subscription
# role (reclaimd creates no subscription: roles/pubsub.subscriber is all it needs).
resource "google_pubsub_subscription_iam_member" "reclaimd_subscribes" {
  count        = var.replicas
  project      = var.project
  subscription = google_pubsub_subscription.reclaimd[count.index].name
  role         = "roles/pubsub.subscriber"
  member       = "serviceAccount:${local.gsa_email}"
}

# GKE Workload Identity: reclaimd's KSA acts as the GSA.
resource "google_service_account_iam_member" "reclaimd_workload_identity" {
  count              = var.workload_identity_ksa == "" ? 0 : 1
  service_account_id = "projects/${var.project}/serviceAccounts/${local.gsa_email}"
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project}.svc.id.goog[${var.workload_identity_ksa}]"
}

output "subscription" {
  description = "config.pubsub.subscription (with config.pubsub.project = var.project): the stem of the slots' subscriptions"
  value       = var.name
}

output "slots" {
  description = "config.pubsub.slots (the chart sets it from controller.replicas by default)"
  value       = var.replicas
}

output "subscriptions" {
  description = "Every slot's subscription, slot 0 first"
  value       = google_pubsub_subscription.reclaimd[*].name
}

output "gsa_email" {
  description = "serviceAccount.gcpServiceAccount: the GSA reclaimd's KSA acts as (Workload Identity)"
  value       = local.gsa_email
}

output "project" {
  description = "config.pubsub.project"
  value       = var.project
}
