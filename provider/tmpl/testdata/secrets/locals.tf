locals {
  key  = var.aws_secret_key
  both = "${local.key}:${var.aws_access_key}"
}
