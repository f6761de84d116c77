# spotwise on GCP: a service account for the controller and for the nodes, and the checkpoint bucket.
terraform {
  required_providers {
    google = { source = "hashicorp/google", version = ">= 5.0" }
  }
}

variable "project" {
  type = string
}
variable "region" {
  type    = string
  default = "us-central1"
}
variable "bucket" {
  type = string
}
variable "checkpoint_retention_days" {
  type    = number
  default = 30
}

provider "google" {
  project = var.project
  region  = var.region
}

# The controller creates/deletes/lists instances and polls zone operations. A custom role keeps it
# to the permissions gcp.py uses (instances.insert/get/delete/aggregatedList, zoneOperations.wait).
resource "google_project_iam_custom_role" "spotwise" {
  role_id = "spotwiseController"
  title   = "spotwise controller"
  permissions = [
    "compute.instances.create", "compute.instances.delete", "compute.instances.get",
    "compute.instances.list", "compute.instances.setLabels", "compute.instances.setMetadata",
    "compute.instances.setServiceAccount", "compute.disks.create", "compute.disks.setLabels",
    "compute.subnetworks.use", "compute.subnetworks.useExternalIp", "compute.networks.useExternalIp",
    "compute.zoneOperations.get", "compute.images.useReadOnly", "compute.machineTypes.get",
  ]
}

resource "google_service_account" "controller" {
  account_id   = "spotwise-controller"
  display_name = "spotwise controller"
}

resource "google_project_iam_member" "controller" {
  project = var.project
  role    = google_project_iam_custom_role.spotwise.id
  member  = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_service_account" "node" {
  account_id   = "spotwise-node"
  display_name = "spotwise GPU node"
}

# The controller attaches the node service account to instances (SPOTWISE_GCP_SERVICE_ACCOUNT).
resource "google_service_account_iam_member" "controller_uses_node" {
  service_account_id = google_service_account.node.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_storage_bucket" "checkpoints" {
  name                        = var.bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  versioning { enabled = true }
  lifecycle_rule {
    condition { age = var.checkpoint_retention_days }
    action { type = "Delete" }
  }
  lifecycle_rule {
    condition {
      num_newer_versions = 1
      with_state         = "ARCHIVED"
    }
    action { type = "Delete" }
  }
  # Google-managed encryption at rest is always on; set encryption { default_kms_key_name } for CMEK.
}

resource "google_storage_bucket_iam_member" "node_checkpoints" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.node.email}"
}

output "node_service_account" { value = google_service_account.node.email }
output "checkpoint_uri" { value = "gs://${google_storage_bucket.checkpoints.name}/spotwise" }
