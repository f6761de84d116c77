# spotwise on AWS: the checkpoint bucket, the least-privilege policy for the spotwise controller
# (orchestrator / CLI) and the role its GPU nodes run as (checkpoints only).
terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

variable "region" {
  type    = string
  default = "us-east-1"
}
variable "bucket" {
  type        = string
  description = "checkpoint bucket name (globally unique)"
}
variable "vpc_id" {
  type        = string
  default     = ""
  description = "VPC spotwise launches into (its subnets go in SPOTWISE_AWS_SUBNETS); empty: any VPC"
}
variable "checkpoint_retention_days" {
  type    = number
  default = 30
}

provider "aws" { region = var.region }

resource "aws_s3_bucket" "checkpoints" {
  bucket = var.bucket
  tags   = { "spotwise" = "checkpoints" }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  versioning_configuration { status = "Enabled" }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default { sse_algorithm = "aws:kms" }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# spotwise keeps the last K checkpoints itself; the bucket drops overwritten/deleted versions and
# unfinished multipart uploads (a preempted node's half-written shard), and expires old runs.
resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    id     = "old-checkpoints"
    status = "Enabled"
    filter {}
    expiration { days = var.checkpoint_retention_days }
    noncurrent_version_expiration { noncurrent_days = 3 }
    abort_incomplete_multipart_upload { days_after_initiation = 1 }
  }
}

# The controller's policy: exactly the API actions spotwise calls (tests/provisioner/test_infra.py
# checks this file against the code).
resource "aws_iam_policy" "spotwise" {
  name   = "spotwise-controller"
  policy = templatefile("${path.module}/iam-policy.json", { bucket = var.bucket, vpc_id = var.vpc_id == "" ? "*" : var.vpc_id })
}

# GPU nodes: read/write checkpoints, nothing else (the head address reaches workers via
# instance tags in IMDS, which needs no IAM permission).
resource "aws_iam_role" "node" {
  name = "spotwise-node"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Action = "sts:AssumeRole", Principal = { Service = "ec2.amazonaws.com" } }]
  })
}

resource "aws_iam_role_policy" "node_checkpoints" {
  name = "checkpoints"
  role = aws_iam_role.node.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      { Effect = "Allow", Action = ["s3:ListBucket"], Resource = aws_s3_bucket.checkpoints.arn },
      { Effect = "Allow", Action = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts"], Resource = "${aws_s3_bucket.checkpoints.arn}/*" },
    ]
  })
}

resource "aws_iam_instance_profile" "node" {
  name = "spotwise-node"
  role = aws_iam_role.node.name
}

output "policy_arn" { value = aws_iam_policy.spotwise.arn }
output "instance_profile" { value = aws_iam_instance_profile.node.name } # SPOTWISE_AWS_INSTANCE_PROFILE
output "checkpoint_uri" { value = "s3://${aws_s3_bucket.checkpoints.bucket}/spotwise" }
