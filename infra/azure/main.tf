# spotwise on Azure: the resource group spotwise launches into, the VNet its nodes live in, and a
# role with only what provisioner/azure.py does. Apply once per subscription:
#   terraform init && terraform apply -var principal_id=$(az ad signed-in-user show --query id -o tsv)
# Checkpoints go to an S3-compatible endpoint (docs/provisioner.md, "Checkpoints on Azure"); nothing
# here stores them.
terraform {
  required_providers {
    azurerm = { source = "hashicorp/azurerm", version = ">= 3.100" }
  }
}

variable "location" {
  type    = string
  default = "eastus"
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

data "azurerm_subscription" "current" {}

resource "azurerm_resource_group" "spotwise" {
  name     = "spotwise" # SPOTWISE_AZURE_RESOURCE_GROUP
  location = var.location
  tags     = { spotwise = "resource-group" }
}

# The VNet azure.py would create on first launch (same name, prefix and subnet, so its idempotent
# PUT finds it): created here so a VM for the orchestrator (or a VPN gateway) can join it first —
# the head's Jobs API listens on its private address only.
resource "azurerm_virtual_network" "spotwise" {
  name                = "spotwise-${var.location}"
  location            = var.location
  resource_group_name = azurerm_resource_group.spotwise.name
  address_space       = [var.vnet_cidr]
  tags                = { spotwise = "network" }
}

resource "azurerm_subnet" "nodes" {
  name                 = "nodes"
  resource_group_name  = azurerm_resource_group.spotwise.name
  virtual_network_name = azurerm_virtual_network.spotwise.name
  address_prefixes     = [cidrsubnet(var.vnet_cidr, 20 - tonumber(split("/", var.vnet_cidr)[1]), 0)]
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
      "Microsoft.Network/virtualNetworks/subnets/read",
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/networkInterfaces/delete",
      "Microsoft.Network/networkInterfaces/join/action",
      "Microsoft.Network/networkSecurityGroups/read",
      "Microsoft.Network/networkSecurityGroups/write",
      "Microsoft.Network/networkSecurityGroups/delete",
      "Microsoft.Network/networkSecurityGroups/join/action",
      "Microsoft.Network/publicIPAddresses/read",   # gc/cleanup sweep tagged public IPs (none are created)
      "Microsoft.Network/publicIPAddresses/delete",
      "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action",   # attach the nodes' identity
    ]
  }
  assignable_scopes = [azurerm_resource_group.spotwise.id]
}

# list_all() reads VMs subscription-wide to find strays: reader at subscription scope.
resource "azurerm_role_definition" "spotwise_list" {
  name  = "spotwise-lister"
  scope = data.azurerm_subscription.current.id
  permissions {
    actions = ["Microsoft.Compute/virtualMachines/read", "Microsoft.Network/networkInterfaces/read"]
  }
  assignable_scopes = [data.azurerm_subscription.current.id]
}

resource "azurerm_role_assignment" "spotwise" {
  scope              = azurerm_resource_group.spotwise.id
  role_definition_id = azurerm_role_definition.spotwise.role_definition_resource_id
  principal_id       = var.principal_id
}

resource "azurerm_role_assignment" "spotwise_list" {
  scope              = data.azurerm_subscription.current.id
  role_definition_id = azurerm_role_definition.spotwise_list.role_definition_resource_id
  principal_id       = var.principal_id
}

# The nodes' identity (SPOTWISE_AZURE_NODE_IDENTITY = output node_identity_id): its only right is
# deleting VMs of the resource group, so a node's dead man's switch can delete its own VM when its
# runner is gone (a guest shutdown would leave the VM allocated and billing).
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
    actions = ["Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/delete"]
  }
  assignable_scopes = [azurerm_resource_group.spotwise.id]
}

resource "azurerm_role_assignment" "node_self_delete" {
  scope              = azurerm_resource_group.spotwise.id
  role_definition_id = azurerm_role_definition.node_self_delete.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.node.principal_id
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
