# spotwise on Azure: the resource group spotwise launches into and a role with only what azure.py does.
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

provider "azurerm" {
  features {}
}

data "azurerm_subscription" "current" {}

resource "azurerm_resource_group" "spotwise" {
  name     = "spotwise" # SPOTWISE_AZURE_RESOURCE_GROUP
  location = var.location
  tags     = { spotwise = "resource-group" }
}

resource "azurerm_role_definition" "spotwise" {
  name        = "spotwise-controller"
  scope       = azurerm_resource_group.spotwise.id
  description = "Create, list and delete spotwise VMs and their NICs/VNets"
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
    ]
  }
  assignable_scopes = [azurerm_resource_group.spotwise.id]
}

# list_all() reads VMs and NICs subscription-wide to find strays: reader at subscription scope.
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
