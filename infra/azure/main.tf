# spotwise on Azure: the resource group spotwise launches into, the VNet its nodes live in, and a
# role with only what provisioner/clouds/azure/cloud.py does. Apply once per subscription:
#   terraform init && terraform apply -var principal_id=$(az ad signed-in-user show --query id -o tsv)
# Checkpoints go to an S3-compatible endpoint (docs/provisioner.md, "Checkpoints on Azure"); nothing
# here stores them.
terraform {
  required_providers {
    azurerm = { source = "hashicorp/azurerm", version = ">= 3.100" }
  }
}

variable "location" {
  description = "where the resource group and the node identity live"
  type        = string
  default     = "eastus"
}
# Every Azure region with an offer the planner ranks by default (spotwise.provisioner.sites.default_regions;
# tests/provisioner/test_infra_regions.py keeps this list complete). Each gets the VNet spotwise-<region>
# with its subnet "nodes" and a NAT gateway for outbound access (billed by the hour and GB: infra/README.md).
variable "locations" {
  type    = list(string)
  default = ["centralus", "eastus", "eastus2", "northcentralus", "southcentralus", "westus", "westus2", "westus3"]
}
variable "principal_id" {
  type        = string
  description = "object id of the identity spotwise runs as"
}
variable "vnet_cidr" {
  type        = string
  default     = "10.42.0.0/16" # SPOTWISE_AZURE_VNET_CIDR; nodes use its first /20
  description = "address space of the spotwise VNet (one per region, named spotwise-<region>)"
}

provider "azurerm" {
  features {}
}

resource "azurerm_resource_group" "spotwise" {
  name     = "spotwise" # SPOTWISE_AZURE_RESOURCE_GROUP
  location = var.location
  tags     = { spotwise = "resource-group" }
}

# The VNet azure.py would create on first launch in each region (same name, prefix and subnet, so it
# finds them and creates nothing): created here so a VM for the orchestrator (or a VPN gateway) can
# join it first — the head's Jobs API listens on its private address only — and so that nodes, which
# have no public IP, reach package registries through the region's NAT gateway (VNets created after
# 2025-09-30 get no default outbound access).
resource "azurerm_virtual_network" "spotwise" {
  for_each            = toset(var.locations)
  name                = "spotwise-${each.key}"
  location            = each.key
  resource_group_name = azurerm_resource_group.spotwise.name
  address_space       = [var.vnet_cidr]
  tags                = { spotwise = "network" }
}

resource "azurerm_subnet" "nodes" {
  for_each             = toset(var.locations)
  name                 = "nodes"
  resource_group_name  = azurerm_resource_group.spotwise.name
  virtual_network_name = azurerm_virtual_network.spotwise[each.key].name
  address_prefixes     = [cidrsubnet(var.vnet_cidr, 20 - tonumber(split("/", var.vnet_cidr)[1]), 0)]
}

resource "azurerm_public_ip" "nat" {
  for_each            = toset(var.locations)
  name                = "spotwise-nat-${each.key}"
  location            = each.key
  resource_group_name = azurerm_resource_group.spotwise.name
  allocation_method   = "Static"
  sku                 = "Standard"
  tags                = { spotwise = "nat" }
}

resource "azurerm_nat_gateway" "spotwise" {
  for_each            = toset(var.locations)
  name                = "spotwise-${each.key}"
  location            = each.key
  resource_group_name = azurerm_resource_group.spotwise.name
  sku_name            = "Standard"
  tags                = { spotwise = "nat" }
}

resource "azurerm_nat_gateway_public_ip_association" "spotwise" {
  for_each             = toset(var.locations)
  nat_gateway_id       = azurerm_nat_gateway.spotwise[each.key].id
  public_ip_address_id = azurerm_public_ip.nat[each.key].id
}

resource "azurerm_subnet_nat_gateway_association" "nodes" {
  for_each       = toset(var.locations)
  subnet_id      = azurerm_subnet.nodes[each.key].id
  nat_gateway_id = azurerm_nat_gateway.spotwise[each.key].id
}

resource "azurerm_role_definition" "spotwise" {
  name        = "spotwise-controller"
  scope       = azurerm_resource_group.spotwise.id
  description = "Create, list and delete spotwise VMs, their NICs, OS disks and per-cluster NSGs"
  permissions {
    actions = [
      "Microsoft.Compute/virtualMachines/read",
      "Microsoft.Compute/virtualMachines/write",
      "Microsoft.Compute/virtualMachines/delete",
      "Microsoft.Compute/disks/read",
      "Microsoft.Compute/disks/write",
      "Microsoft.Compute/disks/delete",
      "Microsoft.Network/virtualNetworks/read",
      "Microsoft.Network/virtualNetworks/write",
      "Microsoft.Network/virtualNetworks/subnets/write", # the spotwise subnet added to an operator's VNet
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/networkInterfaces/delete",
      "Microsoft.Network/networkInterfaces/join/action",
      "Microsoft.Network/networkSecurityGroups/read",
      "Microsoft.Network/networkSecurityGroups/write",
      "Microsoft.Network/networkSecurityGroups/delete",
      "Microsoft.Network/networkSecurityGroups/join/action",
      "Microsoft.Network/publicIPAddresses/read", # gc/cleanup sweep tagged public IPs
      "Microsoft.Network/publicIPAddresses/write", # a head reached over ssh: its own public IP
      "Microsoft.Network/publicIPAddresses/delete",
      "Microsoft.Network/publicIPAddresses/join/action",
      "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action", # attach the nodes' identity
    ]
  }
  assignable_scopes = [azurerm_resource_group.spotwise.id]
}

resource "azurerm_role_assignment" "spotwise" {
  scope              = azurerm_resource_group.spotwise.id
  role_definition_id = azurerm_role_definition.spotwise.role_definition_resource_id
  principal_id       = var.principal_id
}

# The nodes' identity (SPOTWISE_AZURE_NODE_IDENTITY = output node_identity_id): its only ARM right is
# deleting VMs of the resource group, so a node's dead man's switch can delete its own VM when its
# runner is gone (a guest shutdown would leave the VM allocated and billing); its only data right
# is the storage account's blobs (node_storage below).
resource "azurerm_user_assigned_identity" "node" {
  name                = "spotwise-node"
  resource_group_name = azurerm_resource_group.spotwise.name
  location            = azurerm_resource_group.spotwise.location
}

resource "azurerm_role_definition" "node_self_delete" {
  name        = "spotwise-node-self-delete"
  scope       = azurerm_resource_group.spotwise.id
  description = "A spotwise node deletes its own VM when its runner's lease runs out"
  permissions {
    actions = ["Microsoft.Compute/virtualMachines/delete"]
  }
  assignable_scopes = [azurerm_resource_group.spotwise.id]
}

resource "azurerm_role_assignment" "node_self_delete" {
  scope              = azurerm_resource_group.spotwise.id
  role_definition_id = azurerm_role_definition.node_self_delete.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.node.principal_id
}

# Checkpoints and the shipped build: az://STORAGE_ACCOUNT/spotwise/PREFIX. Nodes read and write it as
# their identity (no keys anywhere): Storage Blob Data Contributor on the account, for the node
# identity and for whoever runs spotwise (it uploads the build and reads checkpoints back).
variable "storage_account" {
  type        = string
  description = "globally unique storage account name (3-24 lowercase letters and digits) for az:// storage"
}

resource "azurerm_storage_account" "spotwise" {
  name                            = var.storage_account
  resource_group_name             = azurerm_resource_group.spotwise.name
  location                        = azurerm_resource_group.spotwise.location
  account_tier                    = "Standard"
  account_replication_type        = "LRS"
  shared_access_key_enabled       = false # identities only: no account key to leak into an image
  allow_nested_items_to_be_public = false
}

resource "azurerm_storage_container" "spotwise" {
  name                  = "spotwise"
  storage_account_id    = azurerm_storage_account.spotwise.id
  container_access_type = "private"
}

resource "azurerm_role_assignment" "node_storage" {
  scope                = azurerm_storage_account.spotwise.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.node.principal_id
}

resource "azurerm_role_assignment" "launcher_storage" {
  scope                = azurerm_storage_account.spotwise.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = var.principal_id
}

output "storage" {
  value = "az://${azurerm_storage_account.spotwise.name}/${azurerm_storage_container.spotwise.name}/runs"
}

output "node_identity_id" {
  value = azurerm_user_assigned_identity.node.id
}

output "resource_group" {
  value = azurerm_resource_group.spotwise.name
}
output "vnet_cidr" {
  value = var.vnet_cidr
}
