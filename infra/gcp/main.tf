# spotwise on GCP: a service account for the controller and for the nodes, the network the nodes
# run in — a subnetwork in every region a plan may rank (var.regions), private addresses only: Cloud
# NAT per region for package downloads, Private Google Access for the checkpoint bucket — and the
# checkpoint bucket, which nodes reach as their service account (gs://, no key anywhere).
#
#   terraform apply -var project=my-proj -var bucket=my-ckpt-bucket
#
# then export what `terraform output` prints (see the README's "Run on GCP").
terraform {
  required_providers {
    google = { source = "hashicorp/google", version = ">= 5.0" }
  }
}

variable "project" {
  type = string
}
variable "region" {
  description = "the provider's default region and the checkpoint bucket's location"
  type        = string
  default     = "us-central1"
}
# Every GCP region with an offer the planner ranks by default (spotwise.provisioner.sites.default_regions;
# tests/provisioner/test_infra_regions.py keeps this list complete). Each gets a subnetwork
# spotwise-<region> and a Cloud NAT (billed per VM-hour and GB; see infra/README.md).
variable "regions" {
  type = list(string)
  default = ["asia-east1", "asia-northeast1", "asia-northeast3", "asia-south1", "asia-southeast1", "australia-southeast1",
    "europe-north1", "europe-west1", "europe-west2", "europe-west3", "europe-west4", "europe-west6", "me-central2",
    "me-west1", "northamerica-northeast1", "northamerica-northeast2", "us-central1", "us-east1", "us-east4", "us-east5",
  "us-south1", "us-west1", "us-west3", "us-west4"]
}
variable "bucket" {
  type = string
}
variable "checkpoint_retention_days" {
  type    = number
  default = 30
}
variable "subnet_cidr" {
  description = "the nodes' address space: each region's subnetwork is a /20 of it, in var.regions order"
  type        = string
  default     = "10.64.0.0/12"
}

provider "google" {
  project = var.project
  region  = var.region
}

# The controller creates/deletes/lists instances, the cluster's firewall rules, and sweeps the
# disks/addresses a cluster left; it polls zone, global and region operations and reads the zone
# operations for compute.instances.preempted. A custom role keeps it to the permissions gcp.py
# uses (checked against the calls it makes by tests/provisioner/clouds/gcp/test_gcp_cluster.py).
resource "google_project_iam_custom_role" "spotwise" {
  role_id = "spotwiseController"
  title   = "spotwise controller"
  permissions = [
    "compute.instances.create", "compute.instances.delete", "compute.instances.get",
    "compute.instances.list", "compute.instances.setLabels", "compute.instances.setMetadata",
    "compute.instances.setServiceAccount", "compute.instances.setTags",
    "compute.disks.create", "compute.disks.setLabels", "compute.disks.list", "compute.disks.delete",
    "compute.addresses.list", "compute.addresses.delete",
    "compute.firewalls.create", "compute.firewalls.delete", "compute.firewalls.list", "compute.firewalls.get",
    "compute.networks.updatePolicy", "compute.networks.get",
    "compute.subnetworks.use", "compute.subnetworks.list",
    "compute.routers.list",   # the plan reads which regions have Cloud NAT (routers.aggregatedList)
    "compute.zoneOperations.get", "compute.zoneOperations.list", "compute.globalOperations.get",
    "compute.regionOperations.get", "compute.images.useReadOnly", "compute.machineTypes.get",
    # the head's external address: the launcher reaches it over ssh (SPOTWISE_HEAD_PATH=ssh, the default)
    "compute.subnetworks.useExternalIp", "compute.networks.useExternalIp",
  ]
}

# The nodes' network: no external addresses but the head's (reached by the launcher over ssh). Cloud NAT lets them reach package registries (a node
# image without spotwise pip-installs it at boot); Private Google Access lets them reach the bucket.
# One subnetwork, router and NAT per region of var.regions.
resource "google_compute_network" "spotwise" {
  name                    = "spotwise"
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "spotwise" {
  for_each                 = toset(var.regions)
  name                     = "spotwise-${each.key}"
  region                   = each.key
  network                  = google_compute_network.spotwise.id
  ip_cidr_range            = cidrsubnet(var.subnet_cidr, 20 - tonumber(split("/", var.subnet_cidr)[1]), index(var.regions, each.key))
  private_ip_google_access = true
}

resource "google_compute_router" "spotwise" {
  for_each = toset(var.regions)
  name     = "spotwise-${each.key}"
  region   = each.key
  network  = google_compute_network.spotwise.id
}

resource "google_compute_router_nat" "spotwise" {
  for_each                           = toset(var.regions)
  name                               = "spotwise-${each.key}"
  router                             = google_compute_router.spotwise[each.key].name
  region                             = each.key
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
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

# A node whose runner died deletes its own instance (a guest shutdown would leave it TERMINATED
# with its disk billed): the node account may delete spotwise's instances ("sw-" names) and
# nothing else in Compute Engine. Its instances carry the compute scope for that one call.
resource "google_project_iam_custom_role" "node_self_delete" {
  role_id     = "spotwiseNodeSelfDelete"
  title       = "spotwise node: delete itself"
  permissions = ["compute.instances.delete"]
}

resource "google_project_iam_member" "node_self_delete" {
  project = var.project
  role    = google_project_iam_custom_role.node_self_delete.id
  member  = "serviceAccount:${google_service_account.node.email}"
  condition {
    title      = "spotwise instances only"
    expression = "resource.type == 'compute.googleapis.com/Instance' && resource.name.extract('/instances/{name}').startsWith('sw-')"
  }
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

# The launcher ships its build into the bucket and reads the run's checkpoints and outputs back;
# run as the controller account it needs the same object role (a user's own ADC: grant it to them).
resource "google_storage_bucket_iam_member" "controller_checkpoints" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.controller.email}"
}

output "node_service_account" { value = google_service_account.node.email }
output "controller_service_account" { value = google_service_account.controller.email }
output "network" { value = "global/networks/${google_compute_network.spotwise.name}" }
# SPOTWISE_GCP_SUBNETWORK: the provisioner puts each node in its own region's subnetwork
output "subnetwork" { value = "regions/{region}/subnetworks/spotwise-{region}" }
output "client_cidrs" { value = var.subnet_cidr }
# nodes reach it as node_service_account (scope devstorage.read_write, role objectUser): no HMAC key
output "checkpoint_uri" { value = "gs://${google_storage_bucket.checkpoints.name}/spotwise" }
