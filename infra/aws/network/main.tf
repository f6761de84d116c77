# One region's network for spotwise nodes: a VPC, a private subnet per availability zone (nodes get no
# public address: no $0.005/h public IPv4 each), and outbound access through one NAT gateway (package
# downloads when the node image lacks spotwise) plus a free S3 gateway endpoint (checkpoints never go
# through the NAT, whose data processing is billed per GB). Used once per region by ../regions.tf.
terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

variable "cidr" {
  type        = string
  description = "the VPC's address space (a /16; distinct per region so VPCs can be peered later)"
}

data "aws_region" "current" {}

data "aws_availability_zones" "available" {
  state = "available"
  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

locals {
  zones = data.aws_availability_zones.available.names
}

resource "aws_vpc" "spotwise" {
  cidr_block           = var.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = "spotwise", spotwise = "network" }
}

# the nodes' subnets: one /20 per zone, private (map_public_ip_on_launch off)
resource "aws_subnet" "nodes" {
  count                   = length(local.zones)
  vpc_id                  = aws_vpc.spotwise.id
  availability_zone       = local.zones[count.index]
  cidr_block              = cidrsubnet(var.cidr, 4, count.index)
  map_public_ip_on_launch = false
  tags                    = { Name = "spotwise-nodes-${local.zones[count.index]}", spotwise = "nodes" }
}

# the heads' subnets: one /24 per zone, public (the internet gateway is their default route), so a
# head's public address answers the launcher's ssh (SPOTWISE_HEAD_PATH=ssh, the default); a node
# subnet's default route is the NAT gateway, where replies to a public address would not return
resource "aws_subnet" "heads" {
  count             = length(local.zones)
  vpc_id            = aws_vpc.spotwise.id
  availability_zone = local.zones[count.index]
  cidr_block        = cidrsubnet(var.cidr, 8, 240 + count.index)
  tags              = { Name = "spotwise-heads-${local.zones[count.index]}", spotwise = "heads" }
}

resource "aws_route_table_association" "heads" {
  count          = length(aws_subnet.heads)
  subnet_id      = aws_subnet.heads[count.index].id
  route_table_id = aws_route_table.public.id
}

# the NAT gateway's own subnet (public: the internet gateway is its default route)
resource "aws_subnet" "nat" {
  vpc_id            = aws_vpc.spotwise.id
  availability_zone = local.zones[0]
  cidr_block        = cidrsubnet(var.cidr, 8, 255)
  tags              = { Name = "spotwise-nat", spotwise = "nat" }
}

resource "aws_internet_gateway" "spotwise" {
  vpc_id = aws_vpc.spotwise.id
  tags   = { spotwise = "network" }
}

resource "aws_eip" "nat" {
  domain = "vpc"
  tags   = { spotwise = "nat" }
}

resource "aws_nat_gateway" "spotwise" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.nat.id
  tags          = { spotwise = "nat" }
  depends_on    = [aws_internet_gateway.spotwise]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.spotwise.id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.spotwise.id
  }
  tags = { spotwise = "nat" }
}

resource "aws_route_table_association" "nat" {
  subnet_id      = aws_subnet.nat.id
  route_table_id = aws_route_table.public.id
}

# the nodes' default route: the NAT gateway (outbound only)
resource "aws_route_table" "nodes" {
  vpc_id = aws_vpc.spotwise.id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.spotwise.id
  }
  tags = { spotwise = "nodes" }
}

resource "aws_route_table_association" "nodes" {
  count          = length(aws_subnet.nodes)
  subnet_id      = aws_subnet.nodes[count.index].id
  route_table_id = aws_route_table.nodes.id
}

# checkpoints to S3 in this region without the NAT (a gateway endpoint is free)
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.spotwise.id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.nodes.id]
  tags              = { spotwise = "network" }
}

output "subnet_ids" { value = aws_subnet.nodes[*].id }
output "head_subnet_ids" { value = aws_subnet.heads[*].id }
output "vpc_id" { value = aws_vpc.spotwise.id }
output "cidr" { value = var.cidr }
